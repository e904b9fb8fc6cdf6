"""Time a task's eager and torch.compile baselines in fresh processes of their own, from a
reference run that has timed eager once already, and cache the result.

Their calls are handed out and timed by the judge (``driver``) exactly as the candidate's
are, so a time means the same thing for both: on the CPU the judge's clock, on CUDA device
time held to the judge's clock the same way (``verify.bounded``).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from cuda_agent.judge import baselines as baseline_cache
from cuda_agent.judge.clock import ClockError, JudgeClock, judge_clock
from cuda_agent.judge.gpu_turn import GpuTurn
from cuda_agent.judge.plan import JudgeError, JudgePlan
from cuda_agent.judge.retime import Timed
from cuda_agent.judge.runner import Worker, WorkerOutcome, close_all
from cuda_agent.judge.trust import problems
from cuda_agent.judge.turn_phases import trusted_job
from cuda_agent.judge.verify import bounded, run_stats
from cuda_agent.results import TimingStats


def time_baselines(plan: JudgePlan, ref: WorkerOutcome, ref_clock: JudgeClock | None,
                   new_worker: Callable[[], Worker], tracer: str | None, turn: GpuTurn
                   ) -> baseline_cache.Baselines:
    """Eager time from the reference and up to ``plan.baseline_processes - 1`` more
    processes, torch.compile's from up to that many processes (all started at once, timed
    one after another); each pooled over its processes. A kind takes no more processes once
    two or more of its medians agree within ``AGREE`` x the interval the judge aims at: more
    processes average away offsets between processes, and where there are none worth the
    name they only cost time. ``tracer`` is the fixed layer the timing jobs load (the
    device timer on CUDA). Each process holds the judge's GPU ``turn`` shared from its job on
    (torch.compile's compilation, its first call, made apart) and exclusive through its
    stand-ins and timing (``turn_phases``), and ends within it."""
    cfg = plan.cfg
    timed = ref.result.get("samples_ms") and ref_clock is not None
    runs: dict[str, list[Timed]] = {"eager": [Timed(ref, ref_clock, [])] if timed else [],
                                    "compile": []}
    most = {"eager": plan.baseline_processes if timed else 0,
            "compile": plan.baseline_processes if cfg.time and cfg.time_compile else 0}
    spares = [new_worker() for _ in range(most["eager"] - len(runs["eager"]) + most["compile"])]
    tolerance = AGREE * cfg.rel_ci_for(plan.device)
    try:
        for role in ("eager", "compile"):
            while len(runs[role]) < most[role] and not _agree(runs[role], tolerance):
                worker = spares.pop()
                job = plan.job(role, time=True, tracer=tracer,
                               shared_gpu=turn.path is not None)
                with trusted_job(turn) as turns:
                    driver = worker.drive(plan.baseline_driver(), turns=turns)
                    done = worker.run(job, cfg.process_timeout_s)
                    worker.close()
                name = "torch.compile" if role == "compile" else "eager"
                if not done.ok:
                    raise JudgeError(f"{name} baseline failed: {done.failure}")
                try:
                    runs[role].append(Timed(done, judge_clock(driver.records), []))
                except ClockError as exc:
                    raise JudgeError(f"{name} baseline's calls could not be timed: "
                                     f"{exc}") from None
    finally:
        close_all(spares)
    meaning = ref.result.get("time_meaning", "wall")
    base = baseline_cache.stamp(baseline_cache.Baselines(
        timing_of(runs["eager"], meaning, cfg), timing_of(runs["compile"], meaning, cfg),
        ref.result.get("bandwidth_gbs"), meaning), plan.device)
    if cfg.time and cfg.cache_baselines and cfg.store_baselines and timed and _steady(base, cfg):
        baseline_cache.store(plan.baseline_key, base)
    return base


AGREE = 2.0
"""Processes' medians within this many target intervals of each other need no more."""


def _agree(runs: list[Timed], tolerance: float) -> bool:
    if len(runs) < 2:
        return False
    medians = [run_stats(run).median_ms for run in runs]
    return (max(medians) - min(medians)) <= tolerance * statistics.fmean(medians)


def timing_of(runs: list[Timed], meaning: str, cfg: Any) -> TimingStats | None:
    """The processes' times pooled and held to the judge's clock (``verify.bounded``)."""
    if not runs:
        return None
    return bounded([run_stats(run) for run in runs], [run.clock for run in runs], meaning,
                   cfg)[0]


def _steady(base: baseline_cache.Baselines, cfg: Any) -> bool:
    """Whether every measured baseline is steady enough to compare against (``trust``): an
    unsteady one is used by this judgement only, and the next measures it again."""
    return not any(problems(name, stats, base.meaning, cfg)
                   for name, stats in (("eager", base.eager), ("torch.compile", base.compile))
                   if stats is not None)
