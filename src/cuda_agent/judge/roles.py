"""What the trusted judge processes do: the reference, and the eager and torch.compile
baselines (run inside workers; the candidate's process is ``harness``).

The reference builds ``Model`` and saves its weights, makes one call to learn the outputs'
sizes (and which outputs share memory with an input), times eager when asked and measures
the memory bandwidth. It then stays (held) until the candidate has run and computes the
outputs of exactly the calls the judge kept (``reference_kept``): their seeds are known to
no one before the calls are made, and which calls are kept, to no one before they return.
"""

from __future__ import annotations

import copy
import secrets
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from cuda_agent.judge import timing
from cuda_agent.judge.calls import CallChannel
from cuda_agent.judge.digest import digest
from cuda_agent.judge.fan_in import BUDGET_S as FAN_IN_BUDGET_S
from cuda_agent.judge.fan_in import report
from cuda_agent.judge.harness import load_tracer, timing_blocker
from cuda_agent.judge.source import CallSource
from cuda_agent.judge.transport import Packer, pack_size
from cuda_agent.judge.worker import as_outputs, autocast, make_inputs, seed_all
from cuda_agent.tasks.degenerate import Degeneracy

_STATE: dict[str, Any] = {}
"""The reference's model, its float64 twin and forward, kept for ``reference_kept``."""


def _double(model: torch.nn.Module) -> torch.nn.Module | None:
    try:
        return copy.deepcopy(model).double()
    except Exception:
        return None


def baseline(job: dict[str, Any], ns: dict[str, Any], out: Path, result: dict, device: str
             ) -> None:
    """The reference (weights, sizes, eager timing), the eager baseline timed again
    (``eager``) or the torch.compile baseline (``compile``)."""
    result["stage"] = "init"
    seed_all(job["init_seed"])
    model = ns["Model"](*ns["get_init_inputs"]())
    model = model.to(device).eval()
    if job["role"] == "reference":
        torch.save(model.state_dict(), job["state_path"])
    else:
        model.load_state_dict(torch.load(job["state_path"], weights_only=True))
    if job["role"] == "compile":
        model = torch.compile(model)
    precision = job["precision"]

    def forward(*inputs: Any) -> Any:
        with autocast(precision, device):
            return model(*inputs)

    if job["role"] == "reference":
        result["stage"] = "forward"
        _STATE.update(ns=ns, forward=forward, device=device)
        _first_call(job, ns, forward, model, result, device)
    if job["time"]:
        if job.get("shared_gpu"):  # the reference has made its first call already
            _first_call_apart(None if job["role"] == "reference" else forward, ns, device,
                              result)
        _time(job, ns, forward, device, result)
    if job.get("bandwidth"):
        result["bandwidth_gbs"] = _bandwidth(device)


def _time(job: dict[str, Any], ns: dict[str, Any], forward: Any, device: str,
          result: dict) -> None:
    """``forward``'s calls timed as the judge hands them out (stand-ins first)."""
    result["stage"] = "timing"
    blocker = timing_blocker(load_tracer(job["tracer"]), device) if job.get("tracer") \
        else None
    source = CallSource(lambda seed, scale: make_inputs(ns, seed, device, scale),
                        CallChannel())
    stand_in_ms = timing.wall_calls(lambda *inputs: None, source, device, "calibrate")
    measured = timing.measure(forward, source, device, **_timing_kwargs(job),
                              blocker=blocker, offset_ms=statistics.median(stand_in_ms))
    result["samples_ms"], result["time_meaning"] = measured.samples, measured.meaning
    result["timing_details"] = measured.details


def reference_check(job: dict[str, Any], result: dict) -> None:
    """The held reference's calls timed again (``job["timing"]``, a short run): the fresh
    check a cached baseline is held to (``judge.recheck``). Its call socket is unused until
    then: a reference whose first job timed eager is never asked."""
    ns, forward, device = _STATE["ns"], _STATE["forward"], _STATE["device"]
    if job.get("shared_gpu"):
        _first_call_apart(None, ns, device, result)
    _time(job, ns, forward, device, result)


def _timing_kwargs(job: dict[str, Any]) -> dict[str, Any]:
    timing_ = job["timing"]
    kwargs = {k: timing_[k] for k in ("warmup", "min_runs", "max_runs", "budget_s",
                                      "target_rel_ci")}
    if "floor_runs" in timing_:
        kwargs["floor_runs"] = timing_["floor_runs"]
    return kwargs


def _first_call_apart(forward: Any, ns: dict[str, Any], device: str, result: dict) -> None:
    """Baselines timed on a GPU shared with other judges (``job["shared_gpu"]``): the first
    call (``forward``'s, None where it was made), which for torch.compile is the whole
    compilation, is made before the stand-ins, and the device synchronised, so the judge
    holds the GPU's turn shared through it and exclusive from the first stand-in on
    (``turn_phases``)."""
    result["stage"] = "first_call"
    if forward is not None:
        with torch.no_grad():
            forward(*make_inputs(ns, secrets.randbits(62), device))
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _first_call(job: dict[str, Any], ns: dict[str, Any], forward: Any,
                model: torch.nn.Module, result: dict, device: str) -> None:
    """One call on inputs of no consequence: the outputs' and inputs' sizes (the judge
    plans the kept calls and the packs by them), which outputs share memory with an input
    (a candidate's may too), and the bytes a call moves (the memory floor)."""
    took: list[float] = []

    def timed(*inputs: Any) -> Any:  # what a call takes plans the checks (``budget``)
        start = time.perf_counter()
        out = forward(*inputs)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        took.append(time.perf_counter() - start)
        result["call_s"] = min(took)  # the first call sets up what later ones reuse
        return out

    with torch.no_grad():
        inputs = make_inputs(ns, secrets.randbits(62), device)
        given = [x for x in inputs if isinstance(x, torch.Tensor)]
        # reported even if the call fails: what the judge's memory message names
        result["input_bytes"] = sum(x.numel() * x.element_size() for x in given)
        outputs = as_outputs(timed(*inputs))
    made = [t for t in outputs if isinstance(t, torch.Tensor)]
    result["sizes"] = {
        "outputs": [t.numel() * t.element_size() for t in made],
        "wide": [t.numel() * (8 if t.is_floating_point() else t.element_size()) for t in made],
        "inputs": [x.numel() * x.element_size() for x in given]}
    result["aliases"] = [[k, j] for k, t in enumerate(outputs) if isinstance(t, torch.Tensor)
                         for j, x in enumerate(inputs) if isinstance(x, torch.Tensor)
                         and _shares(t, x)]
    result["io_bytes"] = sum(result["sizes"]["outputs"]) + sum(result["sizes"]["inputs"])
    if not job.get("check", True):  # timing alone: nothing will be compared
        return
    result["degenerate"] = _degenerate(job.get("degenerate") or {}, ns, forward=timed,
                                       device=device)
    model64 = _double(model) if job.get("float64", True) else None
    result["float64"] = model64 is not None
    # the precision budget's reduction length, while the kernels build; where a call takes
    # over a third of its budget, its float64 forward alone would too and it measures none
    _STATE["fan_in"] = None
    if model64 is not None and result["call_s"] <= FAN_IN_BUDGET_S / 3:
        doubled = [x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                   for x in inputs]
        _STATE["fan_in"] = report(model64, doubled)
    _STATE.update(ns=ns, forward=forward, model64=model64, device=device)


def _degenerate(asked: dict[str, Any], ns: dict[str, Any], forward: Any, device: str
                ) -> str | None:
    """Whether a trivial answer (a constant, one value repeated, an input) would pass the
    judge's comparison at trials of the reference's own (``asked``: how many at scale 1,
    the other scales, the judge's tolerances): a degenerate task, named in the verdict.
    Stops at the first trial where no trivial answer passes."""
    check = Degeneracy(asked.get("atol"), asked.get("rtol"))
    scales = [1.0] * int(asked.get("trials", 0)) + [float(x) for x in asked.get("scales", [])]
    with torch.no_grad():
        for scale in scales:
            if not check.open:
                break
            seed = secrets.randbits(62)
            outputs = as_outputs(forward(*make_inputs(ns, seed, device, scale)))
            check.add(outputs, make_inputs(ns, seed, device, scale))  # as they were given
    return check.reason() if scales else None


def _shares(a: torch.Tensor, b: torch.Tensor) -> bool:
    sa, sb = a.untyped_storage(), b.untyped_storage()
    return a.device == b.device and sa.data_ptr() < sb.data_ptr() + sb.nbytes() and \
        sb.data_ptr() < sa.data_ptr() + sa.nbytes()


def reference_kept(job: dict[str, Any], out: Path, result: dict, number: int) -> None:
    """The reference's outputs for the calls the judge kept (``job["sets"]``: seed, scale
    and whether to add the float64 twin), with their inputs' digests under ``job["key"]``,
    packed for the judge."""
    ns, forward, model64, device = (_STATE[k] for k in ("ns", "forward", "model64", "device"))
    folder = out / f"kept-{number}"
    folder.mkdir(exist_ok=True)
    packer = Packer(folder, device)
    packer.reserve(int(job.get("reserve") or 0))
    sets = []
    with torch.no_grad():
        for seed, scale, wide in job["sets"]:
            inputs = make_inputs(ns, int(seed), device, float(scale))
            entry = {"out": packer.add(as_outputs(forward(*inputs))),
                     "digest": digest([x for x in inputs if isinstance(x, torch.Tensor)],
                                      int(job["key"])),
                     "out64": None}
            if wide and model64 is not None:
                doubled = [x.double() if isinstance(x, torch.Tensor) and x.is_floating_point()
                           else x for x in inputs]
                try:
                    entry["out64"] = packer.add(as_outputs(model64(*doubled)))
                except Exception as exc:  # some operators have no float64 kernel
                    model64 = _STATE["model64"] = None
                    result["float64_error"] = f"{type(exc).__name__}: {exc}"[:300]
                del doubled
            sets.append(entry)
            del inputs
    result["float64"] = model64 is not None
    result["fan_in"] = _STATE.get("fan_in")
    result["outputs"] = {"pack": packer.finish(), "folder": folder.name, "sets": sets}


def kept_bytes(sizes: dict[str, list[int]], wide: bool) -> int:
    """Bytes of one kept call's outputs in the reference's pack (with the float64 twin)."""
    return pack_size(sizes["outputs"]) + (pack_size(sizes["wide"]) if wide else 0)


def _bandwidth(device: str) -> float:
    """Copy bandwidth (bytes read + written per second, in GB/s) of the device's memory."""
    n = (1 << 28) if device.startswith("cuda") else (1 << 25)
    src = torch.rand(n, device=device)
    dst = torch.empty_like(src)

    def copy_once() -> None:
        dst.copy_(src)

    source = CallSource(lambda seed, scale: [])  # no one's code runs: no judge to ask
    samples = timing.measure(copy_once, source, device, warmup=2, min_runs=10,
                             max_runs=30, budget_s=1.0).samples
    return 2 * n * 4 / (min(samples) * 1e-3) / 1e9


