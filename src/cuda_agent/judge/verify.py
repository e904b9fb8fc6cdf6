"""Checks run in the judge's process on what the workers sent back (judge-v3)."""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any

import torch

from cuda_agent.judge.baselines import Baselines
from cuda_agent.judge.clock import JudgeClock
from cuda_agent.judge.compare import compare_trials, precision_budget, slack_of
from cuda_agent.judge.config import JudgeConfig
from cuda_agent.judge.digest import digest
from cuda_agent.judge.driver import Snapshot
from cuda_agent.judge.plan import Reference
from cuda_agent.judge.record import Verdict
from cuda_agent.judge.retime import Timed
from cuda_agent.judge.timing import TIME_MEANINGS, clean_samples, median_ci, pooled, worker_stats
from cuda_agent.judge.trust import doubt
from cuda_agent.results import TimingStats
from cuda_agent.tasks.tolerance import declared

UNJOINED_MAX_SHARE = 0.1
"""More timed calls than this share left work running on another stream: not correct."""


def check_kept(verdict: Verdict, reference: Reference, kept: list[Snapshot], key: int,
               precision: str, cfg: JudgeConfig) -> bool:
    """The kept calls against the reference's answers: their outputs element-wise and by
    relative norm (against float64 where a twin exists: the precision budget), and their
    inputs unchanged (digests under the judgement's key)."""
    atol, rtol = _tolerances(precision, cfg)
    n = len(reference.wide)
    slack = slack_of(reference.eager, precision) + [reference.slack] * (len(kept) - n)
    compared = compare_trials(reference.outputs, [s.outputs for s in kept], atol, rtol,
                              norm_from=n, slack=slack)
    verdict.correctness = dataclasses.replace(compared, trials=cfg.trials)
    budget_problems: list[str] = []
    cand = [s.outputs for s in kept[:n]]
    if n and _same_shapes(reference.outputs[:n], cand):
        budget_problems, _, _ = precision_budget(reference.eager, reference.wide, cand,
                                                 precision)
    elif not n:
        verdict.flags.append("float64 reference unavailable: precision judged by tolerances only")
    changed = []
    for s, expected in zip(kept, reference.digests, strict=True):
        got = digest(s.inputs, key)
        if len(got) != len(expected):
            changed.append(f"call {s.index}: {len(got)} inputs handed over, {len(expected)} "
                           "expected")
        changed += [f"call {s.index}: input {k} was modified by forward()"
                    for k, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b]
    if verdict.correctness.correct and not budget_problems and not changed:
        return True
    precision_first = budget_problems and budget_problems[0].startswith("precision")
    verdict.reasons.extend([*budget_problems, *verdict.correctness.reasons] if precision_first
                           else [*verdict.correctness.reasons, *budget_problems])
    verdict.reasons.extend(changed[:3])
    return False


def _tolerances(precision: str, cfg: JudgeConfig) -> tuple[float | None, float | None]:
    """``cfg``'s atol and rtol, or the declared precision's where ``cfg`` leaves them open
    (None: the output dtype's own, ``compare.TOLERANCES``)."""
    return declared(precision, cfg.atol, cfg.rtol)


def _same_shapes(reference: list[list[Any]], outputs: list[list[Any]]) -> bool:
    return all(len(r) == len(o) and all(type(b) is torch.Tensor and a.shape == b.shape
                                        for a, b in zip(r, o, strict=True))
               for r, o in zip(reference, outputs, strict=True))


def check_run(verdict: Verdict, run: Timed, base: Baselines) -> bool:
    """One process's own reports that can only fail it (work left on another stream, an
    activity record that does not match) and its time's meaning; False after failing the
    verdict."""
    result = run.outcome.result
    details = result.get("timing_details")
    if _unjoined(verdict, details if isinstance(details, dict) else {}):
        return False
    meaning = result.get("time_meaning", "wall")
    if not isinstance(meaning, str) or meaning != base.meaning or meaning not in TIME_MEANINGS:
        verdict.correct = False
        verdict.reasons.append(f"candidate timed as {str(meaning)[:40]!r} time, baselines as "
                               f"{base.meaning!r}: not comparable (the judge's timer did "
                               "not load in the candidate's process?)")
        return False
    if clean_samples(result.get("samples_ms")) is None:  # ``report.report`` refuses it first
        verdict.correct = False
        verdict.reasons.append("candidate's process reported no usable timing samples")
        return False
    return True


def check_timing(verdict: Verdict, runs: list[Timed], base: Baselines,
                 io_bytes: int | None, cfg: JudgeConfig) -> None:
    """The candidate's time, pooled over its processes (``timing.pooled``) and bounded by
    the judge's clock (``bounded``); whether its speed-up over each baseline can be told
    from noise (``trust.doubt``); then the memory floor."""
    meaning = runs[0].outcome.result.get("time_meaning", "wall")
    measured, flag = bounded([run_stats(run) for run in runs],
                             [run.clock for run in runs], meaning, cfg)
    if flag:
        verdict.flags.append(flag)
    verdict.timing, verdict.time_meaning = measured, TIME_MEANINGS[meaning]
    verdict.runtime_ms = measured.median_ms if measured else None
    verdict.eager_timing, verdict.compile_timing = base.eager, base.compile
    verdict.eager_ms = base.eager.median_ms if base.eager else None
    verdict.compile_ms = base.compile.median_ms if base.compile else None
    for name, baseline in (("eager", base.eager), ("torch.compile", base.compile)):
        if measured is not None and baseline is not None:
            verdict.doubts[name] = doubt(measured, baseline, name, meaning, cfg)
    if io_bytes and base.bandwidth_gbs and verdict.runtime_ms is not None:
        floor_ms = io_bytes / (base.bandwidth_gbs * 1e9) * 1e3
        if verdict.runtime_ms < cfg.floor_margin * floor_ms:
            verdict.flags.append(
                f"review: {verdict.runtime_ms:.4g} ms is under the memory floor of "
                f"{floor_ms:.4g} ms ({io_bytes / 1e6:.1f} MB of inputs and outputs at "
                f"{base.bandwidth_gbs:.0f} GB/s)")


SETTLE_FROM = 2
"""Processes timed before the reward may be called settled: one has no spread to go by."""
SETTLE_SPREADS = 3.0
SETTLE_REL = 0.02
"""The pooled time must lie further than SETTLE_SPREADS x the processes' spread, and
SETTLE_REL x the threshold, from every milestone's threshold for the reward to be settled:
over 3-5 judgements of one kernel on H100s the runtime moved by at most 0.68%."""


def runs_settled(runs: list[Timed], base: Baselines, cfg: JudgeConfig) -> bool:
    """Whether timing the candidate in more processes could no longer change its reward
    (``JudgeConfig.settle_processes``): ``settled`` of the time ``check_timing`` would give
    from ``runs``."""
    if not cfg.settle_processes or len(runs) < SETTLE_FROM:
        return False
    meaning = runs[0].outcome.result.get("time_meaning", "wall")
    stats = [run_stats(run) for run in runs]
    measured, _ = bounded(stats, [run.clock for run in runs], meaning, cfg)
    return settled(measured, [s.median_ms for s in stats], base, cfg.faster_margin)


def settled(measured: TimingStats | None, medians: list[float], base: Baselines,
            margin: float) -> bool:
    """Whether the pooled time ``measured`` of processes with ``medians`` lies clear of
    every milestone's threshold (``margin`` x each baseline measured)."""
    if measured is None or len(medians) < SETTLE_FROM:
        return False
    spread = max(medians) - min(medians)
    for baseline in (base.eager, base.compile):
        if baseline is None:
            continue
        threshold = margin * baseline.median_ms
        if abs(measured.median_ms - threshold) <= max(SETTLE_SPREADS * spread,
                                                      SETTLE_REL * threshold):
            return False
    return True


def run_stats(run: Timed) -> TimingStats:
    """One process's statistics, of the samples its process reported (held to the judge's
    clock afterwards, ``bounded``)."""
    return worker_stats(run.outcome.result)


def bounded(parts: list[TimingStats], clocks: list[JudgeClock], meaning: str,
            cfg: JudgeConfig) -> tuple[TimingStats | None, str | None]:
    """The processes' time pooled and held to the judge's clock: a time under (the judge's
    median time of the wall calls) / (1 + ``clock_margin``) less the slack
    (``clock_slack_ms`` for device times, ``clock_slack_wall_ms`` for wall times) is raised
    to that, with a flag. The samples come from the worker's own clock (steadier
    than the judge's, which counts the messages too), so what they could gain by lying is
    that margin."""
    measured = pooled(parts)
    medians = sorted(c.median_ms for c in clocks if c.median_ms is not None)
    if not medians:  # a time the judge cannot hold to its clock is no time
        return None, ("no counted call was timed by the judge's clock: the time the "
                      "process reported is not used")
    judged = statistics.median(medians)
    slack = cfg.clock_slack_wall_ms if meaning == "wall" else cfg.clock_slack_ms
    floor = judged / (1 + cfg.clock_margin) - slack
    low, high = median_ci([t for c in clocks for t in c.samples_ms])
    measured = dataclasses.replace(measured, clock_ms=judged, clock_ci_low_ms=low,
                                   clock_ci_high_ms=high)
    if measured.median_ms >= floor:
        return measured, None
    raised = dataclasses.replace(measured, median_ms=floor,
                                 ci_low_ms=min(measured.ci_low_ms, floor),
                                 ci_high_ms=max(measured.ci_high_ms, floor))
    return raised, (f"the judge's clock bounds the time: {measured.median_ms:.4g} ms "
                    f"reported, {judged:.4g} ms per call by the judge's clock; "
                    f"{floor:.4g} ms used")


def _unjoined(verdict: Verdict, details: dict[str, Any]) -> bool:
    """Fail a candidate whose forward returned with work still running on another stream
    (hack 14): a consumer on the calling stream would race with it, and the work itself
    would escape the time of the calling stream (``device_timer.DeviceTimer.unjoined``)."""
    unjoined, calls = _count(details, "unjoined"), _count(details, "calls")
    overran = _count(details, "overran")
    error, problem = _note(details, "activity_error"), _note(details, "activity_problem")
    if error and not any("activity record" in f for f in verdict.flags):
        verdict.flags.append(f"device activity record not taken ({error}): "
                             "work left on another stream was looked for by the timer alone")
    if problem:
        verdict.correct = False
        verdict.reasons.append("the device's activity record does not match the calls made "
                               f"({problem})")
        return True
    if overran:
        recorded = _count(details, "activity_calls")
        seen = (f"{overran} of {recorded} calls recorded after the timed ones, by up to "
                f"{_amount(details, 'overrun_us_max'):.1f} us past the call's end, in "
                "the device's activity record")
    elif calls and unjoined > UNJOINED_MAX_SHARE * calls:
        seen = f"{unjoined} of {calls} timed calls"
    else:
        return False
    verdict.correct = False
    verdict.reasons.append(
        f"forward returned while work it had launched on another stream was still running "
        f"({seen}): join that stream before returning "
        "(torch.cuda.current_stream().wait_stream(stream), or cudaStreamWaitEvent in C++); "
        "a caller reading the outputs on its own stream would race with the work")
    return True


_BIGGEST = 2**53


def _count(details: dict[str, Any], key: str) -> int:
    """A count the worker reported: a whole number from 0 to 2^53, else 0 (the report is
    typed by ``report.report``; any value here, of any type, still cannot raise)."""
    value = details.get(key)
    return value if type(value) is int and 0 <= value <= _BIGGEST else 0


def _amount(details: dict[str, Any], key: str) -> float:
    """An amount the worker reported: a finite number from 0 to 2^53, else 0."""
    value = details.get(key)
    return float(value) if type(value) in (int, float) and 0 <= value <= _BIGGEST else 0.0


def _note(details: dict[str, Any], key: str) -> str:
    """A note the worker reported: a text of at most 300 characters, else none."""
    value = details.get(key)
    return value[:300] if isinstance(value, str) else ""
