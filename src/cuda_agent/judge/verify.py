"""Checks run in the judge's process on what the workers sent back (judge-v3)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from cuda_agent.judge.baselines import Baselines
from cuda_agent.judge.compare import compare_trials, precision_budget, slack_of
from cuda_agent.judge.config import JudgeConfig
from cuda_agent.judge.record import Verdict
from cuda_agent.judge.retime import Timed
from cuda_agent.judge.runner import WorkerOutcome
from cuda_agent.judge.timing import TIME_MEANINGS, pooled, worker_stats

# element-wise tolerance of a declared lower precision (atol, rtol)
PRECISION_TOLERANCE = {"tf32": (5e-3, 5e-3), "bf16": (5e-2, 5e-2), "fp16": (1e-2, 1e-2)}
CROSSCHECK_FACTOR = 3.0
CROSSCHECK_SLACK_MS = 0.05
UNJOINED_MAX_SHARE = 0.1
"""More timed calls than this share left work running on another stream: not correct."""


def check_outputs(verdict: Verdict, reference: dict[str, Any], outputs: list[list[Any]],
                  precision: str, cfg: JudgeConfig) -> bool:
    """Element-wise and relative-norm checks of every trial.

    With a float64 reference the relative-norm criterion is the precision budget (error
    against float64 within a multiple of eager's own); without one it is the relative-norm
    error against the reference under ``rtol``.
    """
    atol, rtol = _tolerances(precision, cfg)
    wide = reference["out64"]
    n = len(wide) if wide is not None else 0  # float64 twins of the first n trials
    verdict.correctness = compare_trials(reference["out"], outputs, atol, rtol, norm_from=n,
                                         slack=slack_of(reference["eager"], precision))
    budget_problems: list[str] = []
    if wide is not None and _same_shapes(reference["out"][:n], outputs[:n]):
        budget_problems, _, _ = precision_budget(reference["eager"], wide, outputs[:n],
                                                 precision)
    elif wide is None:
        verdict.flags.append("float64 reference unavailable: precision judged by tolerances only")
    if verdict.correctness.correct and not budget_problems:
        return True
    precision_first = budget_problems and budget_problems[0].startswith("precision")
    verdict.reasons.extend([*budget_problems, *verdict.correctness.reasons] if precision_first
                           else [*verdict.correctness.reasons, *budget_problems])
    return False


def _tolerances(precision: str, cfg: JudgeConfig) -> tuple[float | None, float | None]:
    """``cfg``'s atol and rtol, or the declared precision's where ``cfg`` leaves them open
    (None: the output dtype's own, ``compare.TOLERANCES``)."""
    atol, rtol = cfg.atol, cfg.rtol
    if precision in PRECISION_TOLERANCE:
        atol = PRECISION_TOLERANCE[precision][0] if atol is None else atol
        rtol = PRECISION_TOLERANCE[precision][1] if rtol is None else rtol
    return atol, rtol


def _same_shapes(reference: list[list[Any]], outputs: list[list[Any]]) -> bool:
    return all(len(r) == len(o) and all(type(b) is torch.Tensor and a.shape == b.shape
                                        for a, b in zip(r, o, strict=True))
               for r, o in zip(reference, outputs, strict=True))


def check_run(verdict: Verdict, run: Timed, base: Baselines, reference: dict[str, Any],
              cfg: JudgeConfig) -> bool:
    """Re-check one process's timed outputs, its calls' joins and its time's meaning;
    False after failing the verdict."""
    atol, rtol = _tolerances(verdict.task.precision.value, cfg)  # as the trials' check
    for record in run.outputs:
        expected = reference["timed"][record["variant"]]
        check = compare_trials([expected], [record["out"]], atol, rtol,
                               slack=[reference["timed_slack"]])
        if not check.correct:
            verdict.correct = False
            verdict.reasons.append("timed output differs from the reference for its "
                                   "inputs (results reused across calls?): "
                                   f"{check.reasons[0]}")
            return False
    if _unjoined(verdict, run.outcome.result.get("timing_details") or {}):
        return False
    meaning = run.outcome.result.get("time_meaning", "wall")
    if meaning != base.meaning or meaning not in TIME_MEANINGS:
        verdict.correct = False
        verdict.reasons.append(f"candidate timed as {meaning!r} time, baselines as "
                               f"{base.meaning!r}: not comparable (the judge's timer did "
                               "not load in the candidate's process?)")
        return False
    return True


def check_timing(verdict: Verdict, runs: list[Timed], base: Baselines,
                 reference: dict[str, Any], cfg: JudgeConfig) -> None:
    """Cross-check each process's clock and pool the timings of the processes that each
    passed ``check_run`` and whose clocks agreed, then flag the floor. Where no clock agreed,
    all are pooled and the judge's figures are a floor for the runtime."""
    meaning = runs[0].outcome.result.get("time_meaning", "wall")
    # statistics are computed here, from the raw samples, not in the candidate's process
    parts = [worker_stats(run.outcome.result) for run in runs]
    checks = [_crosscheck(run.outcome, part.median_ms,
                          f" (candidate process {k})" if len(runs) > 1 else "")
              for k, (run, part) in enumerate(zip(runs, parts, strict=True), start=1)]
    agreed = [p for p, c in zip(parts, checks, strict=True) if c.agreed]
    for check in checks:
        if not check.agreed:
            verdict.flags.append(check.flag + (
                "; the process's timing left out" if agreed else
                "; the judge's figure is used" if check.judge_ms is not None else ""))
    measured = pooled(agreed or parts)
    verdict.timing, verdict.time_meaning = measured, TIME_MEANINGS[meaning]
    floors = [] if agreed else [c.judge_ms for c in checks if c.judge_ms is not None]
    verdict.runtime_ms = max([measured.median_ms, *floors])
    verdict.eager_timing, verdict.compile_timing = base.eager, base.compile
    verdict.eager_ms = base.eager.median_ms if base.eager else None
    verdict.compile_ms = base.compile.median_ms if base.compile else None
    io_bytes = reference.get("io_bytes")
    if io_bytes and base.bandwidth_gbs:
        floor_ms = io_bytes / (base.bandwidth_gbs * 1e9) * 1e3
        if verdict.runtime_ms < cfg.floor_margin * floor_ms:
            verdict.flags.append(
                f"review: {verdict.runtime_ms:.4g} ms is under the memory floor of "
                f"{floor_ms:.4g} ms ({io_bytes / 1e6:.1f} MB of inputs and outputs at "
                f"{base.bandwidth_gbs:.0f} GB/s)")


def _unjoined(verdict: Verdict, details: dict[str, Any]) -> bool:
    """Fail a candidate whose forward returned with work still running on another stream
    (hack 14): a consumer on the calling stream would race with it, and the work itself
    would escape the time of the calling stream (``device_timer.DeviceTimer.unjoined``)."""
    unjoined, calls = int(details.get("unjoined") or 0), int(details.get("calls") or 0)
    overran = int(details.get("overran") or 0)
    if details.get("activity_error") and not any("activity record" in f for f in verdict.flags):
        verdict.flags.append(f"device activity record not taken ({details['activity_error']}): "
                             "work left on another stream was looked for by the timer alone")
    if details.get("activity_problem"):
        verdict.correct = False
        verdict.reasons.append("the device's activity record does not match the calls made "
                               f"({details['activity_problem']})")
        return True
    if overran:
        recorded = int(details.get("activity_calls") or 0)
        seen = (f"{overran} of {recorded} calls recorded after the timed ones, by up to "
                f"{float(details.get('overrun_us_max') or 0):.1f} us past the call's end, in "
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


@dataclass(frozen=True)
class ClockCheck:
    """One process's calls timed by the judge's clock: whether its own clock agreed, the
    judge's figure (ms per call, None without marks) and the flag to raise if not."""

    agreed: bool
    judge_ms: float | None = None
    flag: str = ""


def _crosscheck(cand: WorkerOutcome, median: float, where: str) -> ClockCheck:
    """The judge's clock against one process's calls. They disagree when the calls took far
    longer by the judge's clock than the process's median says, or when the marks are
    missing (the process holds their pipe). A candidate that patched its timer only where
    it guessed it was not the first process is caught there."""
    marks = dict(reversed(cand.marks))  # the first mark of each label wins
    calls = cand.result.get("crosscheck_calls")
    if "start" not in marks or "end" not in marks or not calls:
        return ClockCheck(False, None, f"timer cross-check missing{where}: the judge's clock "
                          "saw no marks")
    judge_ms = (marks["end"] - marks["start"]) * 1e3 / calls
    if judge_ms <= CROSSCHECK_FACTOR * median + CROSSCHECK_SLACK_MS:
        return ClockCheck(True, judge_ms)
    return ClockCheck(False, judge_ms, (
        f"timer disagreement{where}: the judge's clock measured {judge_ms:.4g} ms per "
        f"call, the candidate's process {cand.result['crosscheck_ms']:.4g} ms (median "
        f"{median:.4g} ms)"))
