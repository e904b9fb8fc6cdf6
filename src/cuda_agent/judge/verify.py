"""Checks run in the judge's process on what the workers sent back (judge-v2)."""

from __future__ import annotations

from typing import Any

from cuda_agent.judge.baselines import Baselines
from cuda_agent.judge.compare import compare_trials, precision_budget
from cuda_agent.judge.config import JudgeConfig
from cuda_agent.judge.record import Verdict
from cuda_agent.judge.runner import WorkerOutcome
from cuda_agent.judge.timing import TIME_MEANING
from cuda_agent.results import TimingStats

# element-wise tolerance of a declared lower precision (atol, rtol)
PRECISION_TOLERANCE = {"tf32": (5e-3, 5e-3), "bf16": (5e-2, 5e-2), "fp16": (1e-2, 1e-2)}
CROSSCHECK_FACTOR = 3.0
CROSSCHECK_SLACK_MS = 0.05


def check_outputs(verdict: Verdict, reference: dict[str, Any], outputs: list[list[Any]],
                  precision: str, cfg: JudgeConfig) -> bool:
    """Element-wise, relative-norm and float64-budget checks of every trial."""
    atol, rtol = cfg.atol, cfg.rtol
    if precision in PRECISION_TOLERANCE:
        atol = PRECISION_TOLERANCE[precision][0] if atol is None else atol
        rtol = PRECISION_TOLERANCE[precision][1] if rtol is None else rtol
    verdict.correctness = compare_trials(reference["out"], outputs, atol, rtol)
    if not verdict.correctness.correct:
        verdict.reasons.extend(verdict.correctness.reasons)
        return False
    if reference["out64"] is None:
        verdict.flags.append("float64 reference unavailable: precision judged by tolerances only")
        return True
    problems, _, _ = precision_budget(reference["out"], reference["out64"], outputs, precision)
    verdict.reasons.extend(problems)
    return not problems


def check_timing(verdict: Verdict, cand: WorkerOutcome, base: Baselines,
                 reference: dict[str, Any], timed: list[dict[str, Any]], cfg: JudgeConfig
                 ) -> None:
    """Re-check timed outputs, take the timings, cross-check clocks, flag the floor."""
    for record in timed:
        expected = reference["timed"][record["variant"]]
        check = compare_trials([expected], [record["out"]], cfg.atol, cfg.rtol)
        if not check.correct:
            verdict.correct = False
            verdict.reasons.append("timed output differs from the reference for its inputs "
                                   f"(results reused across calls?): {check.reasons[0]}")
            return
    stats = TimingStats(**cand.result["timing"])
    verdict.timing, verdict.time_meaning = stats, TIME_MEANING
    verdict.runtime_ms = stats.median_ms
    verdict.eager_timing, verdict.compile_timing = base.eager, base.compile
    verdict.eager_ms = base.eager.median_ms if base.eager else None
    verdict.compile_ms = base.compile.median_ms if base.compile else None
    _crosscheck(verdict, cand)
    io_bytes = reference.get("io_bytes")
    if io_bytes and base.bandwidth_gbs:
        floor_ms = io_bytes / (base.bandwidth_gbs * 1e9) * 1e3
        if verdict.runtime_ms < cfg.floor_margin * floor_ms:
            verdict.flags.append(
                f"review: {verdict.runtime_ms:.4g} ms is under the memory floor of "
                f"{floor_ms:.4g} ms ({io_bytes / 1e6:.1f} MB of inputs and outputs at "
                f"{base.bandwidth_gbs:.0f} GB/s)")


def _crosscheck(verdict: Verdict, cand: WorkerOutcome) -> None:
    marks = dict(reversed(cand.marks))  # the first mark of each label wins
    calls = cand.result.get("crosscheck_calls")
    if "start" not in marks or "end" not in marks or not calls:
        verdict.flags.append("timer cross-check missing: the judge's clock saw no marks")
        return
    judge_ms = (marks["end"] - marks["start"]) * 1e3 / calls
    inside_ms = cand.result["crosscheck_ms"]
    median = verdict.runtime_ms or 0.0
    if judge_ms > CROSSCHECK_FACTOR * max(median, inside_ms) + CROSSCHECK_SLACK_MS:
        verdict.flags.append(
            f"timer disagreement: the judge's clock measured {judge_ms:.4g} ms per call, the "
            f"candidate's process {inside_ms:.4g} ms (median {median:.4g} ms); the judge's "
            "figure is used")
        verdict.runtime_ms = judge_ms
