"""A candidate's process writes its own report: whatever it puts in any field, of any type,
the judge neither raises nor changes its verdict beyond failing it.

The fuzz drives the judge's own path from a report's text to the verdict (``report.outcome``
then the checks ``judge._on_gpu`` makes of one timing process); the end-to-end cases rewrite
the report from inside a real candidate's process, as a hostile candidate can."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from cuda_agent.judge.baselines import Baselines
from cuda_agent.judge.clock import JudgeClock
from cuda_agent.judge.record import Verdict
from cuda_agent.judge.report import WorkerOutcome, outcome, report
from cuda_agent.judge.retime import Timed
from cuda_agent.judge.timing import clean_samples, worker_stats
from cuda_agent.judge.verify import check_run, check_timing
from cuda_agent.results import JudgeResult, TimingStats
from cuda_agent.tasks import load_task
from tests.judge.adversarial.helpers import (
    QUICK,
    judge,
    said,
    scale_add_model,
    write_scale_add,
    write_task,
)

DETAILS = {"calls": 100, "unjoined": 0, "overran": 0, "activity_calls": 0,
           "overrun_us_max": 0.0, "disturbed": 0, "late": 0, "recorded_calls": 0,
           "warmup_seconds": 0.1, "timed_seconds": 0.5, "activity_seconds": 0.0,
           "activity_start_seconds": 0.0}
HONEST = {"ok": True, "stage": "done", "pid": 4321,
          "samples_ms": [1.0 + 0.001 * k for k in range(-5, 6)], "time_meaning": "wall",
          "timing_details": DETAILS, "seccomp": "on", "profile": "",
          "stage_at": {"start": 1.7e9, "load": 1.7e9 + 1.0, "timing": 1.7e9 + 2.0,
                       "done": 1.7e9 + 3.0}}
HOSTILE: list[Any] = [
    None, True, False, 0, -1, -0.5, 7, 10**6, 2**53 + 1, 10**30, 10**4000, math.nan, math.inf,
    -math.inf, 1e308, "", "many", "x" * 50_000, [], [1.0], ["fast"], [None], [[[]]], {},
    {"a": 1}, {"calls": "many"}]
FIELDS = ["ok", "stage", "error", "traceback", "pid", "samples_ms", "time_meaning",
          "timing_details", "profile", "stage_at", "seccomp", "degenerate", "io_bytes",
          "bandwidth_gbs", "float64", "float64_error", "outputs", "sizes", "aliases", "fan_in",
          "an_unknown_field", *(f"timing_details.{k}" for k in [
              *DETAILS, "activity_error", "activity_problem", "an_unknown_detail"]),
          "stage_at.load", "samples_ms.0"]
RAW_TEXTS = ["", "null", "[]", '"ok"', "{", "[" * 100_000 + "]" * 100_000,
             '{"ok": true, "samples_ms": [1' + "0" * 5000 + "]}",
             '{"ok": true, "samples_ms": [1e999], "time_meaning": "wall"}',
             '{"ok": true, "samples_ms": [NaN], "time_meaning": "wall"}',
             '{"ok": true, "time_meaning": "wall"}', "\x00" * 64]

BASE = Baselines(TimingStats(2.0, 1.9, 2.1, 2.0, 11, 1.95, 2.05), None, None, "wall")
CLOCK = JudgeClock(tuple(1.0 + 0.001 * k for k in range(-5, 6)), 0.1, 1.0, 0.0, 0)


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory):
    return load_task(write_task(tmp_path_factory.mktemp("task"), "scale_add"))


def with_value(field: str, value: Any) -> dict[str, Any]:
    """The honest report with ``field`` (``a.b``: key b of field a) set to ``value``."""
    forged = json.loads(json.dumps(HONEST))
    top, _, inner = field.partition(".")
    if not inner:
        forged[top] = value
    elif isinstance(forged[top], list):
        forged[top][int(inner)] = value
    else:
        forged[top][inner] = value
    return forged


def verdict_of(task, done: WorkerOutcome) -> JudgeResult:
    """What the judge makes of one timing process's outcome, its kept calls right: the reads
    of ``judge._on_gpu`` and ``retime.run_candidate``, in their order."""
    verdict = Verdict(task, "cpu", 7)
    verdict.worker_stages("candidate", done.result)
    verdict.compiled = done.ok or done.result.get("stage") not in (
        None, "start", "calibrate", "load")
    if not done.ok:
        return verdict.fail(f"candidate failed: {done.failure}")
    if done.result.get("seccomp", "on") != "on":
        verdict.flags.append(f"review: {done.result['seccomp']}: new native code could be "
                             "loaded during calls")
    verdict.profile = done.result.get("profile", "")
    run = Timed(done, CLOCK, [])
    if not check_run(verdict, run, BASE):
        return verdict.finish(QUICK.faster_margin)
    verdict.correct = True
    check_timing(verdict, [run], BASE, 4096, QUICK)
    return verdict.finish(QUICK.faster_margin)


def judged(task, text: str) -> JudgeResult:
    return verdict_of(task, outcome(text, "done", 0, False, 60.0, timed=True))


def test_the_honest_report_is_judged_faster_than_eager(task):
    result = judged(task, json.dumps(HONEST))
    assert result.correct and result.reward == 2 and result.runtime_ms == pytest.approx(1.0)
    assert ("candidate.load", 1.0) in result.phases


@pytest.mark.parametrize("field", FIELDS)
def test_no_value_of_a_report_field_raises_or_passes_a_lie(task, field: str):
    """Every hostile value in every field: the verdict is the honest one or a failure, and a
    report whose samples are not times is refused, with the reason."""
    honest = judged(task, json.dumps(HONEST))
    for value in HOSTILE:
        forged = with_value(field, value)
        result = judged(task, json.dumps(forged))
        case = f"{field}={str(value)[:40]!r}: {said(result)}"
        failed = result.reward == -1 and not result.correct and bool(result.reasons)
        same = (result.reward, result.correct, result.runtime_ms) == (
            honest.reward, honest.correct, honest.runtime_ms)
        if field.startswith("samples_ms"):  # times, any of them, are the process's to say
            if clean_samples(forged["samples_ms"]) is None:
                assert failed and "refused" in " ".join(result.reasons), case
            else:
                assert result.correct, case
        else:
            assert failed or same, case
        if field == "ok" and value is not True:
            assert failed, case


@pytest.mark.parametrize("text", RAW_TEXTS, ids=range(len(RAW_TEXTS)))
def test_a_report_that_is_not_a_typed_object_fails_the_candidate(task, text: str):
    result = judged(task, text)
    assert result.reward == -1 and not result.correct and result.reasons, said(result)
    assert isinstance(report(text), dict)


def test_the_judges_readers_take_any_value_of_any_type(task):
    """The checks of a worker's timing values, given them untyped (as if ``report`` let
    anything through), fail or pass the candidate but never raise; ``worker_stats`` says
    ValueError."""
    for field in [f for f in FIELDS if f.startswith(("timing_details", "samples_ms",
                                                      "time_meaning"))]:
        for value in HOSTILE:
            raw = with_value(field, value)
            verdict = Verdict(task, "cpu", 7)
            check_run(verdict, Timed(WorkerOutcome(True, raw, None, ""), CLOCK, []), BASE)
            try:
                stats = worker_stats(raw)
            except ValueError:
                assert clean_samples(raw.get("samples_ms")) is None
            else:
                assert stats.left_out >= 0 and math.isfinite(stats.median_ms)


def test_a_report_is_cut_to_its_declared_types():
    forged = with_value("timing_details.unjoined", "many")
    forged["timing_details"] |= {"calls": 10**30, "overrun_us_max": math.nan,
                                 "activity_error": "e" * 10_000, "exposed": 3}
    forged |= {"stage": "s" * 10_000, "stage_at": {f"s{k}": float(k) for k in range(100)},
               "an_unknown_field": 1, "pid": True}
    got = report(json.dumps(forged), timed=True)
    assert set(got["timing_details"]) == set(DETAILS) - {"unjoined", "calls",
                                                          "overrun_us_max"} | {"activity_error"}
    assert len(got["timing_details"]["activity_error"]) == 300 and len(got["stage"]) == 80
    assert len(got["stage_at"]) == 32 and "an_unknown_field" not in got and "pid" not in got
    assert report(json.dumps({**HONEST, "samples_ms": []}), timed=True)["ok"] is False
    untimed = {k: v for k, v in HONEST.items() if k != "samples_ms"}
    assert report(json.dumps(untimed), timed=False)["ok"] is True
    assert report(json.dumps(untimed), timed=True)["stage"] == "report"


# --- end to end: the candidate's own process rewrites its report ----------------------------

REWRITE = '''
import sys

_W = type(sys.meta_path[0]).find_spec.__globals__["make_inputs"].__globals__
_real_report = _W["_report"]


def _report(result, path):
    if path.name == "result.json":
        {rewrite}
    _real_report(result, path)


_W["_report"] = _report
'''
HONEST_FORWARD = "return cuda_extension.scale_add(x, y, self.alpha)"
DETAILS_REWRITE = ('result["timing_details"] = {"unjoined": "many", "calls": [], '
                   '"overran": -1, "late": float("nan"), "disturbed": 10**30, '
                   '"activity_problem": None, "overrun_us_max": float("inf"), '
                   '"activity_calls": {}, "timed_seconds": "long"}')


@pytest.mark.timeout(900)
def test_a_candidate_that_forges_its_timing_details_gets_the_honest_verdict(tmp_path: Path):
    """rt2 C1: values of the wrong type in the details are dropped; the calls were right."""
    candidate = write_scale_add(tmp_path / "c", scale_add_model(
        HONEST_FORWARD, REWRITE.replace("{rewrite}", DETAILS_REWRITE)))
    result = judge(write_task(tmp_path, "scale_add"), candidate)
    assert result.correct and result.reward >= 1, said(result)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("rewrite", ['result["samples_ms"] = []',
                                     'result["samples_ms"] = [float("nan")] * 20',
                                     'result["samples_ms"] = "fast"'],
                         ids=["empty", "nan", "text"])
def test_a_candidate_that_forges_its_samples_is_refused(tmp_path: Path, rewrite: str):
    """rt2 C2: samples that are not times refuse the report, and the candidate fails."""
    candidate = write_scale_add(tmp_path / "c", scale_add_model(
        HONEST_FORWARD, REWRITE.replace("{rewrite}", rewrite)))
    result = judge(write_task(tmp_path, "scale_add"), candidate)
    assert not result.correct and result.reward == -1, said(result)
    assert any("report was refused" in r for r in result.reasons), said(result)
