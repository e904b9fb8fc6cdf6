"""Cached baselines held to a fresh check in every judgement that reads them (docs/judge.md,
"Cached baselines").

A baseline measured on a loaded machine and read on a quiet one (or the reverse) is a wrong
figure with a narrow interval, which the noise rule (``trust``) cannot see. So a judgement
that reads cached baselines times the held reference's calls again, briefly (at most
``baseline_check_calls``, ending from 5 on once they took ``baseline_check_s``): where the
cached eager interval and the check's, each widened by ``trusted_rel_ci``, do not overlap,
both baselines are measured again in fresh processes (``measure_fresh``) and stored when
steady. Where the new figures still disagree with the check, the speed-up over eager is not
counted (``Verdict.unsettled``). torch.compile's figure is held to the check through eager's:
the two were measured together, under the same load.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from cuda_agent.judge import baselines as baseline_cache
from cuda_agent.judge.baseline_runs import time_baselines, timing_of
from cuda_agent.judge.baselines import Baselines
from cuda_agent.judge.clock import ClockError, judge_clock
from cuda_agent.judge.gpu_turn import GpuTurn
from cuda_agent.judge.memory import reference_error, worker_limit
from cuda_agent.judge.plan import JudgeError, JudgePlan
from cuda_agent.judge.record import Verdict
from cuda_agent.judge.retime import Timed
from cuda_agent.judge.runner import Worker
from cuda_agent.judge.trust import load, problems
from cuda_agent.judge.turn_phases import trusted_job
from cuda_agent.results import BaselineSource, TimingStats

CHECK_FLOOR = 5
"""Calls the fresh check times at least, however long they take."""


def checked(verdict: Verdict, plan: JudgePlan, reference: Worker, cached: Baselines,
            origin: str, new_worker: Callable[[], Worker], tracer: str | None,
            turn: GpuTurn) -> Baselines:
    """``cached`` (``origin``: 'cached' or 'judge') held to a fresh check by the held
    ``reference``; measured again where they disagree. Records where the baselines used
    came from (``verdict.baselines``) and flags what was measured again, and why."""
    cfg = plan.cfg
    if cfg.baseline_check_s is None or cached.eager is None:
        verdict.baselines.append(source(origin, cached))
        return cached
    fresh = fresh_check(plan, reference, tracer, turn)
    why = disagreement(cached.eager, fresh, cfg.trusted_rel_ci)
    if why is None:
        verdict.baselines.append(source(origin, cached, fresh))
        unsteady = problems("the fresh check", fresh, cached.meaning, cfg)
        if unsteady:  # so wide an interval overlaps any cached figure: it confirms none
            verdict.unsettled["eager"] = (
                "timing unreliable against eager: the cached baseline is unconfirmed, "
                + "; ".join(unsteady) + f"; {load()}: no speed-up counted over it, judge "
                "again on a quieter machine for one")
            return cached
        used, note = confirmed(cached, fresh)
        if note:
            verdict.flags.append(note)
        return used
    if origin == "cached" and cfg.store_baselines:
        baseline_cache.forget(plan.baseline_key)  # wrong: no later judgement may read it
    with turn.first_to_measure():
        base = measure_fresh(plan, new_worker, tracer, turn)
    verdict.baselines.append(source("remeasured", base, fresh))
    verdict.flags.append(f"baselines measured again: {why}; {load()}")
    unsteady = [p for name, stats in (("eager", base.eager), ("torch.compile", base.compile))
                if stats is not None for p in problems(name, stats, base.meaning, cfg)]
    if unsteady:
        verdict.flags.append("baselines still unsteady when measured again: "
                             + "; ".join(unsteady))
    still = disagreement(base.eager, fresh, cfg.trusted_rel_ci) if base.eager else None
    if still is not None:
        verdict.unsettled["eager"] = (
            f"timing unreliable against eager: measured again, {still}; {load()}: no "
            "speed-up counted over it, judge again on a quieter machine for one")
    return base


def confirmed(cached: Baselines, fresh: TimingStats) -> tuple[Baselines, str | None]:
    """The baselines a judgement uses where a steady ``fresh`` check agrees with ``cached``
    (within the intervals and the margin): the faster of the two eager times, with
    torch.compile's scaled as eager's was. The reference runs no faster than the machine
    lets it, so the check's time is never below the true one: where it is below the cached
    one, that figure was slowed (an earlier load) and would inflate every speed-up over it
    by up to the margin; a check slower than the cache lowers nothing (this judgement's load
    only ever costs the candidate). Returns the flag that names a replaced figure."""
    if cached.eager is None or fresh.median_ms >= cached.eager.median_ms:
        return cached, None
    ratio = fresh.median_ms / cached.eager.median_ms
    compile_ = None if cached.compile is None else _scaled(cached.compile, ratio)
    note = (f"the cached eager time {cached.eager.median_ms:.4g} ms is above a fresh check's "
            f"{fresh.median_ms:.4g} ms: the check's time is used"
            + ("" if compile_ is None else f", torch.compile's scaled by {ratio:.3f}"))
    return dataclasses.replace(cached, eager=fresh, compile=compile_), note


def _scaled(stats: TimingStats, ratio: float) -> TimingStats:
    """``stats`` with every time multiplied by ``ratio``."""
    times = {f.name: getattr(stats, f.name) * ratio for f in dataclasses.fields(stats)
             if f.name.endswith("_ms") and getattr(stats, f.name) is not None}
    return dataclasses.replace(stats, **times)


def fresh_check(plan: JudgePlan, reference: Worker, tracer: str | None, turn: GpuTurn
                ) -> TimingStats:
    """Eager's time from a short timing of the held ``reference``'s calls, driven and held
    to the judge's clock as every baseline's are."""
    cfg = plan.cfg
    timing = {**plan.timing, "min_runs": CHECK_FLOOR, "floor_runs": CHECK_FLOOR,
              "max_runs": cfg.baseline_check_calls, "budget_s": cfg.baseline_check_s}
    job = {"check_time": True, "timing": timing, "tracer": tracer,
           "shared_gpu": turn.path is not None}
    with trusted_job(turn) as turns:
        driver = reference.drive(plan.baseline_driver(timing), turns=turns)
        done = reference.followup(job, cfg.process_timeout_s)
    if not done.ok:
        raise JudgeError(reference_error(plan.task.name, done, worker_limit(cfg, plan.device),
                                         " timing its calls again"))
    try:
        clock = judge_clock(driver.records)
    except ClockError as exc:
        raise JudgeError(f"reference's calls could not be timed again: {exc}") from None
    stats = timing_of([Timed(done, clock, [])], done.result.get("time_meaning", "wall"),
                      cfg)
    if stats is None:
        raise JudgeError("reference's calls timed again gave no time")
    return stats


def disagreement(cached: TimingStats, fresh: TimingStats, margin: float) -> str | None:
    """Why ``cached`` and ``fresh`` cannot be the same time: their 95% intervals, each
    widened by ``margin`` (a fraction), do not overlap; None where they can."""
    if fresh.ci_high_ms * (1 + margin) < cached.ci_low_ms / (1 + margin):
        side = "slower"
    elif fresh.ci_low_ms / (1 + margin) > cached.ci_high_ms * (1 + margin):
        side = "faster"
    else:
        return None
    return (f"the cached eager time {cached.median_ms:.4g} ms ({_span(cached)}) is {side} "
            f"than a fresh check's {fresh.median_ms:.4g} ms ({_span(fresh)}) beyond both "
            f"95% intervals and ±{margin:.0%}")


def measure_fresh(plan: JudgePlan, new_worker: Callable[[], Worker], tracer: str | None,
                  turn: GpuTurn) -> Baselines:
    """Both baselines measured now: a fresh reference process times eager (the first of
    its processes), then ``time_baselines``; stored where steady."""
    cfg = plan.cfg
    worker = new_worker()
    with trusted_job(turn) as turns:
        try:
            driver = worker.drive(plan.baseline_driver(), turns=turns)
            ref = worker.run(plan.job("reference", time=True, bandwidth=True, tracer=tracer,
                                      check=False, shared_gpu=turn.path is not None),
                             cfg.process_timeout_s)
        finally:
            worker.close()
    if not ref.ok:
        raise JudgeError(reference_error(plan.task.name, ref, worker_limit(cfg, plan.device)))
    try:
        clock = judge_clock(driver.records)
    except ClockError as exc:
        raise JudgeError(f"reference's calls could not be timed: {exc}") from None
    return time_baselines(plan, ref, clock, new_worker, tracer, turn)


def source(origin: str, base: Baselines, check: TimingStats | None = None) -> BaselineSource:
    """What the verdict says of baselines of ``origin`` (``BaselineSource.source``)."""
    at = "" if base.measured_at is None else time.strftime(
        "%Y-%m-%dT%H:%M:%SZ", time.gmtime(base.measured_at))
    return BaselineSource(origin, at, base.load, base.cpus, base.device_name, check)


def _span(stats: TimingStats) -> str:
    return f"{stats.ci_low_ms:.4g}-{stats.ci_high_ms:.4g}"

