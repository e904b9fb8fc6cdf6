"""The device activity record's reading (``judge.activity``): which calls had work that
outlived them, on spans laid out as the profiler reports them."""

from __future__ import annotations

from cuda_agent.judge.activity import (
    ActivityRecord,
    Span,
    WatchedRecord,
    overruns,
    warm_recorder,
)
from cuda_agent.judge.record import Verdict
from cuda_agent.judge.verify import _unjoined

HOLDER = "(anonymous namespace)::judge_gate_kernel(unsigned long long, unsigned int)"
POST = "(anonymous namespace)::judge_post_kernel(unsigned long long)"


def call(t: int, *work: tuple[str, int, int]) -> list[Span]:
    """One gated call at ``t`` ns: holder 0-50 us, post from 60 us; work relative to ``t``."""
    return [Span(HOLDER, t, t + 50_000), Span(POST, t + 60_000, t + 80_000),
            *(Span(name, t + a, t + b) for name, a, b in work)]


def test_work_ending_before_the_post_is_joined_and_after_it_overran():
    spans = (call(0, ("sin", 50_500, 59_000))  # ended before the post: joined
             + call(1_000_000, ("sin", 1_050_500 - 1_000_000, 64_300))  # 4.3 us past the post
             + call(2_000_000)  # calibration: no work
             + call(3_000_000, ("Memcpy DtoD", 51_000, 60_500)))  # 0.5 us: within the margin
    found = overruns(spans[::-1])  # any order
    assert found.problem is None and found.calls == 4
    assert found.late_ns == (0, 4_300, 0, 500) and found.overran == 1


def test_a_record_that_does_not_pair_holders_and_posts_is_a_problem():
    spans = call(0) + [Span(POST, 70_000, 71_000)]  # a kernel of the candidate's named alike
    assert "1 holders against 2 posts" in overruns(spans).problem
    swapped = [Span(HOLDER, 0, 1), Span(HOLDER, 10, 11), Span(POST, 20, 21), Span(POST, 30, 31)]
    assert "out of order" in overruns(swapped).problem


def test_summary_counts_calls_against_the_timer_and_off_the_gpu_records_nothing():
    record = ActivityRecord(enabled=True)
    record._profile, record.spans = object(), call(0, ("k", 55_000, 70_000)) + call(1_000_000)
    summary = record.summary(calls=2)
    assert summary["activity"] and summary["overran"] == 1 and summary["activity_problem"] is None
    assert summary["overrun_us_max"] == 10.0
    assert "2 calls recorded, 3 made" in record.summary(calls=3)["activity_problem"]
    record.spans = []  # a profiler that saw no device at all: not taken, not a problem
    assert record.summary(calls=3) == {
        "activity": False, "activity_error": "the profiler recorded no device activity"}
    with ActivityRecord(enabled=False) as off:
        pass
    assert off.summary(calls=0) == {"activity": False}


def test_an_overrun_in_the_record_fails_the_verdict_even_when_the_timer_saw_none():
    verdict = Verdict(None, "cuda", 0)
    assert not _unjoined(verdict, {"unjoined": 0, "calls": 50, "overran": 0, "activity": True})
    assert not verdict.reasons
    assert _unjoined(verdict, {"unjoined": 0, "calls": 50, "overran": 3, "activity_calls": 32,
                               "overrun_us_max": 4.3})
    assert not verdict.correct and "3 of 32 calls recorded" in verdict.reasons[0]
    assert "4.3 us" in verdict.reasons[0] and "activity record" in verdict.reasons[0]
    untaken = Verdict(None, "cuda", 0)
    assert not _unjoined(untaken, {"calls": 50, "activity": False, "activity_error": "no CUPTI"})
    assert "not taken (no CUPTI)" in untaken.flags[0] and not untaken.reasons
    broken = Verdict(None, "cuda", 0)
    assert _unjoined(broken, {"calls": 50, "activity_problem": "40 calls recorded, 91 made"})
    assert not broken.correct and "does not match" in broken.reasons[0]


def test_a_profiler_that_cannot_record_the_device_is_reported_not_raised():
    import warnings

    import pytest
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine's profiler records the device (the GPU tests cover it)")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "CUDA is not available, disabling CUDA profiling"
        warm_recorder()  # as a worker does before its job: nothing raised here either
        with ActivityRecord(enabled=True) as record:
            torch.sin(torch.ones(8))
    summary = record.summary(calls=0)
    assert summary["activity"] is False and summary["activity_error"], summary


def test_a_watched_record_checks_threads_first_and_adopts_only_the_recorders():
    seen: list[str] = []

    def watched() -> WatchedRecord:
        return WatchedRecord(ActivityRecord(enabled=False), lambda: seen.append("check"),
                             lambda: seen.append("adopt"))

    with watched():
        seen.append("calls")
    assert seen == ["check", "adopt", "calls", "adopt"]
    seen.clear()
    try:  # a call inside found a new thread: nothing is adopted after the record stops
        with watched():
            raise RuntimeError("a new thread after a recorded call")
    except RuntimeError:
        pass
    assert seen == ["check", "adopt"]
