"""Time a task's eager and torch.compile baselines in fresh processes of their own, from a
reference run that has timed eager once already, and cache the result."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cuda_agent.judge import baselines as baseline_cache
from cuda_agent.judge.plan import JudgeError, JudgePlan
from cuda_agent.judge.runner import Worker, WorkerOutcome, close_all
from cuda_agent.judge.timing import pooled, worker_stats
from cuda_agent.results import TimingStats


def time_baselines(plan: JudgePlan, ref: WorkerOutcome, new_worker: Callable[[], Worker],
                   tracer: str | None, **extra: Any) -> baseline_cache.Baselines:
    """Eager time from the reference and ``plan.baseline_processes - 1`` more processes,
    torch.compile's from that many processes (all started at once, timed one after
    another); each pooled over its processes (``timing.pooled``). ``tracer`` is the
    fixed layer the timing jobs load (the device timer on CUDA); ``extra`` goes into them
    (``measure`` passes its ``gpu_turn``)."""
    cfg = plan.cfg
    eager = worker_stats(ref.result) if ref.result.get("samples_ms") else None
    roles = ["eager"] * (plan.baseline_processes - 1) if eager is not None else []
    if cfg.time and cfg.time_compile:
        roles += ["compile"] * plan.baseline_processes
    workers = [new_worker() for _ in roles]
    parts: dict[str, list[TimingStats]] = {"eager": [eager] if eager else [], "compile": []}
    try:
        for role, worker in zip(roles, workers, strict=True):
            done = worker.run(plan.job(role, time=True, tracer=tracer, **extra),
                              cfg.process_timeout_s)
            worker.close()
            if not done.ok:
                name = "torch.compile" if role == "compile" else "eager"
                raise JudgeError(f"{name} baseline failed: {done.failure}")
            parts[role].append(worker_stats(done.result))
    finally:
        close_all(workers)
    base = baseline_cache.Baselines(
        pooled(parts["eager"]) if parts["eager"] else None,
        pooled(parts["compile"]) if parts["compile"] else None,
        ref.result.get("bandwidth_gbs"), ref.result.get("time_meaning", "wall"))
    if cfg.time and cfg.cache_baselines and eager is not None:
        baseline_cache.store(plan.baseline_key, base)
    return base
