"""The candidate's process: load the candidate, then make every call the judge hands out.

Runs inside the confined worker (``worker.run``). Before any candidate code is loaded it
makes stand-in calls through the same protocol (``timing.stand_ins``: the judge measures
what the protocol costs here) and seeds the allocator with poisoned memory. Then it loads
the extension and ``model_new.py``, hides the judge's own modules, builds ``ModelNew`` under a
seed unrelated to any input, loads the reference's weights and serves the judge's calls
(``timing.measure``, or the ``check`` phase when nothing is timed). Every call runs the same
way: under the run-time guard, its threads watched, its outputs checked to be new memory,
and, when the judge keeps it, copied with its inputs into the pack for the judge to read.
Nothing this process reports decides the verdict on its own; see docs/judge.md.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import secrets
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from cuda_agent.judge import seccomp, timing
from cuda_agent.judge.activity import ActivityRecord, WatchedRecord
from cuda_agent.judge.calls import CallChannel
from cuda_agent.judge.guard import ForwardGuard, poison
from cuda_agent.judge.source import CallSource
from cuda_agent.judge.threads import ThreadWatch
from cuda_agent.judge.transport import Packer, TransportError
from cuda_agent.judge.worker import StageError, as_outputs, make_inputs, seed_all

INLINE_DIR = "torch_extensions"
PROFILE_S = 0.3
"""The operator profile makes three calls, or fewer once they took this long."""


def candidate(job: dict[str, Any], ns: dict[str, Any], out: Path, result: dict) -> None:
    device = job["device"]
    threads = ThreadWatch.settle(device)  # before any candidate code runs
    packer = Packer(out, device, job.get("pack"))
    channel = CallChannel()
    kept = Kept(packer, job.get("aliases") or [])
    source = CallSource(lambda seed, scale: _made(ns, seed, device, scale), channel,
                        pack=kept.pack, finish=kept.let_go)
    stand_ins = [torch.zeros(n, dtype=torch.uint8, device=device)
                 for n in job.get("kept_bytes", {}).get("outputs", [])]
    null = ForwardGuard([], poison_fresh=False)

    def stand_in(*inputs: Any) -> list[torch.Tensor]:
        """What a call costs here but the forward itself: the guard around a forward that
        does nothing, the thread checks around it (the judge subtracts this)."""
        null.run(lambda *x: None, list(inputs))
        return stand_ins

    result["stage"] = "calibrate"
    stand_in_ms = timing.wall_calls(stand_in, source, device, "calibrate",
                                    before=threads.before_call,
                                    watch=lambda: threads.problem("after a stand-in call"))
    stand_ins.clear()
    kept.previous = []
    _seed_allocator(int(job.get("poison_bytes") or 0), device)
    forbid_new_code = seccomp.prepare()  # bound before any candidate code runs
    seccomp.prepare(seccomp.namespace_program())()  # before any candidate code: no new
    # namespace, no mount (a file's name in the memory map is then the file's own)

    def no_new_code() -> None:  # once the warm-up has loaded what the kernels load lazily
        if "seccomp" not in result:
            result["seccomp"] = forbid_new_code() or "on"

    def no_new_threads(stage: str, when: str) -> None:
        problem = threads.problem(when)
        if problem:
            raise StageError(stage, problem)

    result["stage"] = "load"
    model_cls, modules, tracer, blocker = _load_candidate(job)
    result["stage"] = "init"
    seed_all(secrets.randbits(62))  # unrelated to every input's seed
    model = model_cls(*ns["get_init_inputs"]())
    result["stage"] = "weights"
    try:
        model.load_state_dict(torch.load(job["state_path"], weights_only=True))
    except RuntimeError as exc:
        raise StageError("weights", f"load_state_dict failed: {str(exc)[:600]}") from None
    model = model.to(device).eval()
    no_new_threads("load", "once it was loaded")  # Python threads too, by their names
    guard = ForwardGuard(modules, tracer, poison_fresh=False)
    kept.state = [t for t in (*model.parameters(), *model.buffers())]

    def call(*inputs: Any) -> Any:
        outputs, problems = guard.run(model, list(inputs))
        problems += kept.not_new(list(inputs), outputs)
        if problems:
            raise StageError("forward", "; ".join(problems))
        return outputs

    def between() -> None:  # a thread that worked since the last call settled
        if problem := threads.before_call():
            raise StageError("forward", problem)

    def settled() -> None:  # the judge's clock still runs: work while settling is timed
        no_new_threads("timing" if job["time"] else "forward", "after forward returned")

    if not job["time"]:
        result["stage"] = "forward"

        def first_settled() -> None:
            settled()
            no_new_code()

        timing.wall_calls(call, source, device, "check", before=between, watch=first_settled)
        return
    result["stage"] = "timing"
    record = ActivityRecord(blocker is not None and device.startswith("cuda")
                            and job.get("activity", False))
    measured = timing.measure(
        call, source, device, **_timing_kwargs(job), blocker=blocker, before=between,
        watch=settled, offset_ms=statistics.median(stand_in_ms) if stand_in_ms else 0.0,
        warmed=no_new_code,
        record=WatchedRecord(record, lambda: no_new_threads(
            "timing", "before the recorded calls"), threads.adopt) if record.enabled else None)
    result["samples_ms"], result["time_meaning"] = measured.samples, measured.meaning
    result["timing_details"] = measured.details | record.summary(
        int(measured.details.get("recorded_calls", 0)))
    no_new_threads("timing", "after the timed calls")
    if job.get("profile"):  # last: the profiler starts threads of its own
        result["profile"] = _profile_table(model, source.fill_local(), device)
    _inline_cache_out(job)


class Kept:
    """What happens to each call's outputs: checked to be new memory, packed with the
    call's inputs for the judge, then poisoned and let go (so memory a later call's outputs
    get from the allocator never holds an earlier answer)."""

    def __init__(self, packer: Packer, aliases: list[list[int]]):
        self.packer = packer
        self.aliases = {(int(k), int(j)) for k, j in aliases}
        self.state: list[torch.Tensor] = []
        self.previous: list[torch.Tensor] = []

    def not_new(self, inputs: list[Any], out: Any) -> list[str]:
        """Outputs that share memory with an input (unless the reference's output does
        too), with the model's weights or with the previous call's outputs (still held)."""
        problems = []
        for k, value in enumerate(as_outputs(out)):
            if not isinstance(value, torch.Tensor):
                continue
            whose = next((f"input {j}" for j, x in enumerate(inputs)
                          if isinstance(x, torch.Tensor) and (k, j) not in self.aliases
                          and _overlap(value, x)), None)
            whose = whose or next(("the model's weights" for t in self.state
                                   if _overlap(value, t)), None)
            whose = whose or next(("an output of the previous call" for t in self.previous
                                   if _overlap(value, t)), None)
            if whose:
                problems.append(f"output {k} is not new memory: it shares storage with "
                                f"{whose} (return a tensor the kernel wrote this call)")
        return problems

    def pack(self, inputs: list[Any], out: Any) -> dict[str, Any]:
        """Every call's outputs and inputs, copied into the pack before the judge is told the
        call returned (it decides whether to keep the call only then)."""
        self.packer.reset()
        try:
            outputs = self.packer.add(as_outputs(out))
            given = self.packer.add([x for x in inputs if isinstance(x, torch.Tensor)])
        except TransportError as exc:
            raise StageError("forward", str(exc)) from None
        return {"pack": self.packer.flush(), "outputs": outputs, "inputs": given}

    def let_go(self, out: Any) -> None:
        for value in self.previous:
            poison(value)
        self.previous = [v for v in as_outputs(out) if isinstance(v, torch.Tensor)]


def _made(ns: dict[str, Any], seed: int, device: str, scale: float) -> list[Any]:
    """A call's inputs from its seed, the generators then reseeded at random: what the
    candidate can read of them during the call says nothing of the seed."""
    inputs = make_inputs(ns, seed, device, scale)
    seed_all(secrets.randbits(62))
    return inputs


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.device != b.device or a.numel() == 0 or b.numel() == 0:
        return False
    sa, sb = a.untyped_storage(), b.untyped_storage()
    start_a, start_b = sa.data_ptr(), sb.data_ptr()
    return start_a < start_b + sb.nbytes() and start_b < start_a + sa.nbytes()


def _seed_allocator(nbytes: int, device: str) -> None:
    """Allocate ``nbytes`` (twice the kept outputs and inputs) in blocks, poison them and
    free them, so the candidate's first allocations reuse poisoned memory, not memory fresh
    from the system (which is zeroed, and would pass where the answer is zero)."""
    blocks, left = [], nbytes
    while left > 0:
        size = min(left, 1 << 28)
        blocks.append(torch.empty(size, dtype=torch.uint8, device=device).fill_(0xFF))
        left -= size
    for size in (512, 4096, 1 << 16, 1 << 20):  # the allocator's small pools too
        blocks += [torch.empty(size, dtype=torch.uint8, device=device).fill_(0xFF)
                   for _ in range(4)]
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    del blocks


class _NoJudge(importlib.abc.MetaPathFinder):
    """Refuses imports of the judge's package once the candidate is loaded."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == "cuda_agent" or name.startswith("cuda_agent."):
            raise ImportError(f"{name}: the judge's modules are not importable by a candidate")


def _hide_judge() -> None:
    """Take the judge's modules out of reach of ``import`` (the code running here keeps its
    own references): a candidate that could patch them still changes no verdict, since the
    verdict rests on what the judge measures in its own process."""
    for name in [n for n in sys.modules if n == "cuda_agent" or n.startswith("cuda_agent.")]:
        del sys.modules[name]
    sys.meta_path.insert(0, _NoJudge())


def _timing_kwargs(job: dict[str, Any]) -> dict[str, Any]:
    timing_ = job["timing"]
    kwargs = {k: timing_[k] for k in ("warmup", "min_runs", "max_runs", "budget_s",
                                      "target_rel_ci")}
    if "floor_runs" in timing_:
        kwargs["floor_runs"] = timing_["floor_runs"]
    if "warmup_s" in timing_:  # an extra process's shorter warm-up (``split_timing``)
        kwargs["warmup_s"] = timing_["warmup_s"]
    return kwargs


def _load_candidate(job: dict[str, Any]) -> tuple[type, list[Any], Any, Any]:
    """Import the candidate; return ModelNew, the extension modules it uses, the trusted
    fixed-layer module (the extension itself, or the tracer) and its timing blocker, both
    loaded before the candidate's code runs."""
    from cuda_agent.build.builder import load_extension

    modules: list[Any] = []
    if job.get("extension"):
        modules.append(load_extension(job["extension"]))
        fixed = modules[0]
    else:
        fixed = load_tracer(job["tracer"]) if job.get("tracer") else None
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
    blocker = timing_blocker(fixed, job["device"])
    _hide_judge()
    path = Path(job["candidate_dir"]) / "model_new.py"
    spec = importlib.util.spec_from_file_location("model_new", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["model_new"] = module
    spec.loader.exec_module(module)
    model_new = getattr(module, "ModelNew", None)
    if not isinstance(model_new, type):
        raise StageError("load", "model_new.py defines no class `ModelNew`")
    return model_new, modules, fixed, blocker


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


def timing_blocker(fixed: Any, device: str) -> timing.Blocker | None:
    return timing.load_blocker(fixed) if fixed is not None and device.startswith("cuda") \
        else None


def load_tracer(path: str) -> Any:
    """The fixed layer linked alone, imported under its own name (file candidates)."""
    spec = importlib.util.spec_from_file_location("cuda_extension", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules["cuda_agent_tracer"] = module
    return module


def _profile_table(model: Any, inputs: list[Any], device: str, rows: int = 15) -> str:
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device.startswith("cuda"):
        activities.append(ProfilerActivity.CUDA)
    with torch.no_grad(), profile(activities=activities) as prof:
        start = time.perf_counter()
        for _ in range(3):  # or one, where one takes long enough to show where time goes
            model(*inputs)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            if time.perf_counter() - start > PROFILE_S:
                break
    key = "self_cuda_time_total" if device.startswith("cuda") else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=key, row_limit=rows)
