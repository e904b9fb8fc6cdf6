"""What each judge process does: reference/baselines and candidate (run inside workers)."""

from __future__ import annotations

import copy
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

import torch

from cuda_agent.judge import timing
from cuda_agent.judge.activity import ActivityRecord, WatchedRecord
from cuda_agent.judge.budget import OutputPlan, plan_outputs
from cuda_agent.judge.gpu_turn import GpuTurn
from cuda_agent.judge.transport import Packer, TransportError, pack_size
from cuda_agent.judge.worker import (
    StageError,
    as_outputs,
    autocast,
    make_inputs,
    seed_all,
)


def _timing_kwargs(job: dict[str, Any]) -> dict[str, Any]:
    timing_ = job["timing"]
    kwargs = {k: timing_[k] for k in ("warmup", "min_runs", "max_runs", "budget_s",
                                      "target_rel_ci")}
    if "warmup_s" in timing_:  # an extra process's shorter warm-up (``split_timing``)
        kwargs["warmup_s"] = timing_["warmup_s"]
    return kwargs


def _rotation(job: dict[str, Any], namespace: dict[str, Any]) -> timing.Rotation:
    """Input set k < len(timing_seeds) is checked later; the others are fresh each call."""
    seeds = job["timing_seeds"]

    def variant(k: int) -> list[Any]:
        seed = seeds[k] if k < len(seeds) else job["fresh_seed"] + k
        return make_inputs(namespace, seed, job["device"])

    return timing.Rotation(variant, len(seeds))


def _double(model: torch.nn.Module) -> torch.nn.Module | None:
    try:
        return copy.deepcopy(model).double()
    except Exception:
        return None


def baseline(job: dict[str, Any], ns: dict[str, Any], out: Path, result: dict, device: str
             ) -> None:
    """Reference (outputs, float64 outputs, eager timing), the eager baseline timed again
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

    if job["check"] and job["role"] == "reference":
        result["stage"] = "forward"
        _reference_outputs(job, ns, forward, model, Packer(out, device, job.get("pack")), result,
                           device)
    turn = GpuTurn(job.get("gpu_turn"))
    if job["time"]:
        if turn.path is not None:
            _first_call_then_turn(forward, ns, job, device, turn, result)
        result["stage"] = "timing"
        blocker = _blocker(_load_tracer(job["tracer"]), device) if job.get("tracer") else None
        measured = timing.measure(forward, _rotation(job, ns), device, **_timing_kwargs(job),
                                  blocker=blocker)
        result["samples_ms"], result["time_meaning"] = measured.samples, measured.meaning
        result["timing_details"] = measured.details
    if job.get("bandwidth"):
        result["bandwidth_gbs"] = _bandwidth(device)
    turn.release()


def _first_call_then_turn(forward: Any, ns: dict[str, Any], job: dict[str, Any], device: str,
                          turn: GpuTurn, result: dict) -> None:
    """Baselines measured by processes sharing a GPU (``job["gpu_turn"]``, a lock file):
    the first call, which for torch.compile is the whole compilation, runs before the turn;
    warm-up and timing run in it."""
    result["stage"] = "first_call"
    with torch.no_grad():
        forward(*make_inputs(ns, job["fresh_seed"], device))
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    result["stage"] = "gpu_wait"
    turn.acquire()


def _reference_outputs(job: dict[str, Any], ns: dict[str, Any], forward: Any,
                       model: torch.nn.Module, packer: Packer, result: dict, device: str
                       ) -> None:
    """Trial outputs, their float64 twins and the timed sets' outputs, packed for the judge,
    as many as the output budget allows (``judge.budget``; what was kept is reported)."""
    model64 = _double(model) if job.get("float64", True) else None
    result["float64"] = model64 is not None
    trials, wide = [], []
    with torch.no_grad():
        seed0, scale0 = job["trials"][0]
        first_inputs = make_inputs(ns, seed0, device, scale0)
        first = as_outputs(forward(*first_inputs))
        tensors = [t for t in [*first_inputs, *first] if isinstance(t, torch.Tensor)]
        result["io_bytes"] = sum(t.numel() * t.element_size() for t in tensors)
        plan = _output_plan(job, first, model64 is not None)
        result["kept"] = {"trials": list(plan.trials), "wide": plan.wide, "timed": plan.timed,
                          "out_bytes": plan.out_bytes, "reduced": plan.reduced}
        packer.reserve(_pack_bytes(first, len(plan.trials) + plan.timed, plan.wide))
        del tensors
        for position, index in enumerate(plan.trials):  # trial 0 first: it is always kept
            if index == 0:
                inputs, outputs, first_inputs, first = first_inputs, first, None, None
            else:
                seed, scale = job["trials"][index]
                inputs = make_inputs(ns, seed, device, scale)
                outputs = as_outputs(forward(*inputs))
            trials.append(packer.add(outputs))
            if model64 is not None and position < plan.wide:
                wide_inputs = [x.double() if isinstance(x, torch.Tensor) and
                               x.is_floating_point() else x for x in inputs]
                try:
                    wide.append(packer.add(as_outputs(model64(*wide_inputs))))
                except Exception as exc:  # some operators have no float64 kernel
                    model64, result["float64"] = None, False
                    result["float64_error"] = f"{type(exc).__name__}: {exc}"[:300]
                del wide_inputs
            del inputs, outputs
        timed = [packer.add(as_outputs(forward(*make_inputs(ns, seed, device))))
                 for seed in job["timing_seeds"][:plan.timed]]
    result["outputs"] = {"pack": packer.finish(), "trials": trials,
                         "out64": wide if model64 is not None and wide else None,
                         "timed": timed}


def _sizes(first: list[Any]) -> tuple[list[int], list[int]]:
    """The bytes of each tensor of one trial's outputs, and of its float64 twin."""
    tensors = [t for t in first if isinstance(t, torch.Tensor)]
    return ([t.numel() * t.element_size() for t in tensors],
            [t.numel() * (8 if t.is_floating_point() else t.element_size()) for t in tensors])


def _pack_bytes(first: list[Any], sets: int, wide_sets: int) -> int:
    """The pack's bytes: ``sets`` outputs like ``first`` and ``wide_sets`` float64 twins."""
    plain, wide = _sizes(first)
    return sets * pack_size(plain) + wide_sets * pack_size(wide)


def _output_plan(job: dict[str, Any], first: list[Any], wide: bool) -> OutputPlan:
    plain, twin = _sizes(first)
    budget = int(job["output_budget_gb"] * 2**30)
    return plan_outputs(len(job["trials"]), job["fresh_trials"], len(job["timing_seeds"]),
                        sum(plain), sum(twin), budget, wide)


def _bandwidth(device: str) -> float:
    """Copy bandwidth (bytes read + written per second, in GB/s) of the device's memory."""
    n = (1 << 28) if device.startswith("cuda") else (1 << 25)
    src = torch.rand(n, device=device)
    dst = torch.empty_like(src)

    def copy_once() -> None:
        dst.copy_(src)

    rotation = timing.Rotation(lambda k: [], 0)
    samples = timing.measure(copy_once, rotation, device, warmup=2, min_runs=10,
                             max_runs=30, budget_s=1.0).samples
    return 2 * n * 4 / (min(samples) * 1e-3) / 1e9


def _load_candidate(job: dict[str, Any]) -> tuple[type, list[Any], Any, Any]:
    """Import the candidate; return ModelNew, the extension modules it uses, the trusted
    fixed-layer module (the extension itself, or the tracer) and its timing blocker, both
    loaded before the candidate's code runs."""
    modules: list[Any] = []
    if job.get("extension"):
        from cuda_agent.build.builder import load_extension

        modules.append(load_extension(job["extension"]))
        fixed = modules[0]
    else:
        fixed = _load_tracer(job["tracer"]) if job.get("tracer") else None
        import torch.utils.cpp_extension as cpp

        if job.get("inline_cache"):
            _inline_cache_in(Path(job["inline_cache"]))

        def capture(fn):
            def wrapper(*args, **kwargs):
                module = fn(*args, **kwargs)
                modules.append(module)
                return module
            return wrapper

        cpp.load_inline, cpp.load = capture(cpp.load_inline), capture(cpp.load)
    blocker = _blocker(fixed, job["device"])
    path = Path(job["candidate_dir"]) / "model_new.py"
    spec = importlib.util.spec_from_file_location("model_new", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["model_new"] = module
    spec.loader.exec_module(module)
    model_new = getattr(module, "ModelNew", None)
    if not isinstance(model_new, type):
        raise StageError("load", "model_new.py defines no class `ModelNew`")
    return model_new, modules, fixed, blocker


INLINE_DIR = "torch_extensions"
CROSSCHECK_MS = 50.0
"""The length of the back-to-back calls the judge's clock cross-checks (verify.py flags a
3x disagreement, so tens of milliseconds resolve it)."""


def _inline_cache_in(seed: Path) -> None:
    """Compile inline extensions under a fixed path of the private /tmp (so a cached build
    is found up to date), seeded with this source's earlier build."""
    import shutil
    import tempfile

    target = Path(tempfile.gettempdir()) / INLINE_DIR
    if seed.is_dir():
        shutil.copytree(seed, target, symlinks=True, dirs_exist_ok=True)
    os.environ["TORCH_EXTENSIONS_DIR"] = str(target)


def _inline_cache_out(job: dict[str, Any]) -> None:
    """Hand the inline build back to the judge, which may keep it for this source."""
    import shutil

    target = Path(os.environ.get("TORCH_EXTENSIONS_DIR", ""))
    if not job.get("inline_cache") or not target.is_dir():
        return
    back = Path(job["inline_cache"])
    shutil.rmtree(back, ignore_errors=True)
    shutil.copytree(target, back, symlinks=True)


def _blocker(fixed: Any, device: str) -> timing.Blocker | None:
    return timing.load_blocker(fixed) if fixed is not None and device.startswith("cuda") \
        else None


def _load_tracer(path: str) -> Any:
    """The fixed layer linked alone, imported under its own name (file candidates)."""
    spec = importlib.util.spec_from_file_location("cuda_extension", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules["cuda_agent_tracer"] = module
    return module


def candidate(job: dict[str, Any], ns: dict[str, Any], out: Path, result: dict, mark) -> None:
    from cuda_agent.judge.guard import ForwardGuard
    from cuda_agent.judge.threads import ThreadWatch

    device = job["device"]
    threads = ThreadWatch.settle(device)  # before any candidate code runs

    def no_new_threads(stage: str, when: str) -> None:
        problem = threads.problem(when)
        if problem:
            raise StageError(stage, problem)

    model_cls, modules, tracer, blocker = _load_candidate(job)
    result["stage"] = "init"
    seed_all(job["init_seed"])
    model = model_cls(*ns["get_init_inputs"]())
    result["stage"] = "weights"
    try:
        model.load_state_dict(torch.load(job["state_path"], weights_only=True))
    except RuntimeError as exc:
        raise StageError("weights", f"load_state_dict failed: {str(exc)[:600]}") from None
    model = model.to(device).eval()
    no_new_threads("load", "once it was loaded")  # Python threads too, by their names
    guard = ForwardGuard(modules, tracer)

    def checked(inputs: list[Any], stage: str) -> Any:
        before = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
        outputs, problems = guard.run(model, inputs)
        for k, (a, b) in enumerate(zip(inputs, before, strict=True)):
            if isinstance(a, torch.Tensor) and not torch.equal(a, b):
                problems.append(f"input {k} was modified by forward()")
        if problem := threads.problem("after forward returned"):
            problems.append(problem)
        if problems:
            raise StageError(stage, "; ".join(problems))
        return outputs

    packer = Packer(out, device, job.get("pack"))
    trials, timed = [], []
    if job["check"]:
        result["stage"] = "forward"
        for seed, scale in job["trials"]:
            outputs = checked(make_inputs(ns, seed, device, scale), "forward")
            trials.append(_pack(packer, outputs))
    if job["time"]:
        result["stage"] = "timing"
        rotation = _rotation(job, ns)
        record = ActivityRecord(blocker is not None and device.startswith("cuda")
                                and job.get("activity", False))
        measured = timing.measure(model, rotation, device, **_timing_kwargs(job),
                                  audit=lambda inputs: checked(inputs, "timing"),
                                  blocker=blocker, watch=lambda: no_new_threads(
                                      "timing", "after a timed call returned"),
                                  record=WatchedRecord(record, lambda: no_new_threads(
                                      "timing", "before the recorded calls"), threads.adopt)
                                  if record.enabled else None)
        samples, last = measured.samples, measured.last
        result["samples_ms"], result["time_meaning"] = samples, measured.meaning
        result["timing_details"] = measured.details | record.summary(
            int(measured.details.get("recorded_calls", 0)))
        timed = [{"variant": k, "out": _pack(packer, outputs)} for k, outputs in last]
        calls = max(3, min(1000, int(CROSSCHECK_MS / max(sorted(samples)[len(samples) // 2],
                                                           1e-3))))
        result["stage"] = "crosscheck"
        inputs, _ = rotation.prepare(0)
        result["crosscheck_calls"] = calls
        result["crosscheck_ms"] = timing.crosscheck(model, inputs, device, calls, mark)
        no_new_threads("timing", "after the timed calls")
        if job.get("profile"):  # last: the profiler starts threads of its own
            result["profile"] = _profile_table(model, rotation.prepare(0)[0], device)
    result["outputs"] = {"pack": packer.finish(), "trials": trials, "timed": timed}
    _inline_cache_out(job)


def _pack(packer: Packer, outputs: Any) -> list[dict[str, Any]]:
    try:
        return packer.add(as_outputs(outputs))
    except TransportError as exc:
        raise StageError("forward", str(exc)) from None


def _profile_table(model: Any, inputs: list[Any], device: str, rows: int = 15) -> str:
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device.startswith("cuda"):
        activities.append(ProfilerActivity.CUDA)
    with torch.no_grad(), profile(activities=activities) as prof:
        for _ in range(3):
            model(*inputs)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
    key = "self_cuda_time_total" if device.startswith("cuda") else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=key, row_limit=rows)
