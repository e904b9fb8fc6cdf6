"""Timing rules that need no GPU: the device-time arithmetic, the blocker loader, and the
wall-time protocol on the CPU."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from cuda_agent.judge import timing
from cuda_agent.judge.device_timer import (
    IDLE_PROBES_MIN,
    TAIL_SLACK_MS,
    DeviceTimer,
    undisturbed,
)
from cuda_agent.judge.timing import (
    PRE_NS_RANGE,
    TIME_MEANINGS,
    Blocker,
    CallSource,
    Measured,
    device_sample,
    load_blocker,
    measure,
    pre_block_ns,
)

# blocker_post took at most 0.020 ms alone, an idle device sync at most 0.008 ms
POST, IDLE = 0.020, 0.008


def test_honest_call_counts_only_its_stream():
    # blocker_post ran on time and the final sync found an idle GPU
    assert device_sample(0.100, 0.020, 0.008, POST, IDLE) == pytest.approx(0.100)


def test_jitter_below_the_references_adds_nothing():
    assert device_sample(0.100, 0.019, 0.005, POST, IDLE) == pytest.approx(0.100)


def test_side_stream_work_delaying_blocker_post_counts():
    # work on a private stream kept SMs busy 0.090 ms after ev1
    assert device_sample(0.001, 0.110, 0.008, POST, IDLE) == pytest.approx(0.091)


def test_work_queued_after_ev2_counts_through_the_residual():
    # the final device-wide sync waited 0.050 ms longer than on an idle GPU
    assert device_sample(0.001, 0.020, 0.058, POST, IDLE) == pytest.approx(0.051)


def test_both_excesses_add():
    assert device_sample(0.010, 0.030, 0.018, POST, IDLE) == pytest.approx(0.030)


def _timer(rows: list[tuple[float, float, float]], idle: list[float]) -> DeviceTimer:
    timer = DeviceTimer(Blocker(lambda ns: None, {"full": True}))
    timer.post_ref_ms, timer.idle_ms = POST, IDLE
    timer.rows, timer.idle = list(rows), list(idle)
    return timer


def test_idle_reference_comes_from_the_run_once_probed():
    # calibration saw the sync idle at 0.008 ms; during the run it takes 0.011-0.013 ms
    rows = [(0.100, 0.020, 0.012)] * 6
    assert _timer(rows, [0.012] * (IDLE_PROBES_MIN - 1)).samples() == \
        pytest.approx([0.104] * 6)  # too few probes: calibration's reference
    probed = _timer(rows, [0.011, 0.012, 0.013, 0.012, 0.011, 0.013])
    assert probed.idle_ref_ms() == pytest.approx(0.013)
    assert probed.samples() == pytest.approx([0.100] * 6)


def test_post_reference_comes_from_the_probes_once_probed():
    # calibration's empty calls saw the post take 0.020 ms; after a kernel it takes 0.0205
    rows = [(0.100, 0.0205, 0.008)] * 6
    assert _timer(rows, [0.008] * IDLE_PROBES_MIN).samples() == pytest.approx([0.1005] * 6)
    timer = _timer(rows, [0.008] * IDLE_PROBES_MIN)
    timer.idle_tails = [0.0204, 0.0205, 0.0206, 0.0205, 0.0205]
    assert timer.post_ref() == pytest.approx(0.0206 + TAIL_SLACK_MS)
    assert timer.samples() == pytest.approx([0.100] * 6)  # the honest post adds nothing
    timer.rows = [(0.100, 0.0305, 0.008)] * 6  # 10 us of work outlives the calling stream
    assert timer.samples() == pytest.approx([0.1099 - TAIL_SLACK_MS] * 6)


def test_work_queued_after_the_call_still_counts_with_probes():
    # every call leaves 0.040 ms of work behind; the probes (no candidate code) do not
    timer = _timer([(0.010, 0.020, 0.052)] * 6, [0.011, 0.012, 0.012, 0.011, 0.012])
    assert timer.samples() == pytest.approx([0.050] * 6)


@pytest.mark.parametrize(("host_ms", "expected"), [
    (0.0, PRE_NS_RANGE[0]),
    (0.040, 100_000),
    (5.0, PRE_NS_RANGE[1]),
])
def test_pre_block_length(host_ms: float, expected: int):
    assert pre_block_ns(host_ms) == expected


def test_load_blocker():
    assert load_blocker(SimpleNamespace()) is None
    assert load_blocker(SimpleNamespace(_block_device=print)) is None
    calls: list[int] = []
    not_full = SimpleNamespace(_block_device=calls.append, _blocker_info=lambda: {"full": False})
    assert load_blocker(not_full) is None

    def broken() -> dict:
        raise RuntimeError("judge timer: no CUDA-capable device is detected")

    assert load_blocker(SimpleNamespace(_block_device=calls.append, _blocker_info=broken)) is None
    info = {"full": True, "threads_per_block": 1024, "blocks_per_sm": 2, "sm_count": 132}
    blocker = load_blocker(SimpleNamespace(_block_device=calls.append, _blocker_info=lambda: info))
    assert isinstance(blocker, Blocker) and blocker.info == info
    blocker.block(1500.0)
    assert calls == [1500] and isinstance(calls[0], int)
    assert not blocker.gate  # the module has no _gate_arm/_gate_open
    gated: list[tuple] = []
    module = SimpleNamespace(_block_device=calls.append, _blocker_info=lambda: {**info,
                                                                               "gate": True},
                             _gate_arm=lambda *args: gated.append(("arm", *args)),
                             _gate_open=lambda: gated.append(("open",)),
                             _gate_close=lambda ns: gated.append(("close", ns)),
                             _post_spread=lambda: 2500)
    blocker = load_blocker(module)
    assert blocker.gate
    blocker.arm(5e4, SimpleNamespace(cuda_stream=1234))
    blocker.open()
    blocker.close(2e4)
    assert gated == [("arm", 50000, 1234), ("open",), ("close", 20000)]
    assert blocker.post_spread_ms() == 0.0025
    module._post_spread = lambda: -1  # nothing reported
    assert load_blocker(module).post_spread_ms() is None
    del module._post_spread  # an older fixed layer: no gate
    assert not load_blocker(module).gate
    with pytest.raises(RuntimeError, match="no gate"):
        load_blocker(module).arm(1000, SimpleNamespace(cuda_stream=1))
    module._blocker_info = lambda: {**info, "gate": False}  # the driver lacks the operations
    assert not load_blocker(module).gate


def test_meanings_are_explicit():
    assert set(TIME_MEANINGS) == {"device", "wall"}
    assert timing.TIME_MEANING is TIME_MEANINGS["wall"]
    assert "the judge's own clock" in TIME_MEANINGS["wall"]
    assert "every SM" in TIME_MEANINGS["device"]
    assert "held to the judge's own clock" in TIME_MEANINGS["device"]


def test_measure_on_cpu_is_wall_time_and_ignores_a_blocker():
    seen: list[torch.Tensor] = []
    source = CallSource(lambda seed, scale: [torch.full((1000,), float(seed % 97))])
    done: list[torch.Tensor] = []
    source._finish = done.append

    def fn(x: torch.Tensor) -> torch.Tensor:
        seen.append(x)
        return x * 2

    unused = Blocker(lambda ns: pytest.fail("the blocker is for CUDA only"), {"full": True})
    result = measure(fn, source, "cpu", warmup=2, min_runs=8, max_runs=8, budget_s=1.0,
                     blocker=unused)
    assert isinstance(result, Measured) and result.meaning == "wall"
    assert set(result.details) == {"warmup_seconds", "timed_seconds"}  # no device terms
    assert len(result.samples) == 8 and all(s > 0 for s in result.samples)
    assert len(seen) == 2 + 8 == len(done)  # warm-up, timed; each call's output let go
    assert len({x.data_ptr() for x in seen}) == 2  # two buffers, refilled every call
    for x, out in zip(seen[-2:], done[-2:], strict=True):
        assert torch.equal(out, x * 2)


def test_a_local_source_owes_nothing_past_its_own_stop():
    source = CallSource(lambda seed, scale: [])
    assert source.next("timed") is not None and source.next("timed", stop=True) is None
    for phase in ("calibrate", "tail", "check"):
        assert source.next(phase) is None


def test_measure_stops_at_the_confidence_target():
    source = CallSource(lambda seed, scale: [])
    result = measure(lambda: None, source, "cpu", warmup=0, min_runs=10, max_runs=500,
                     budget_s=10.0, target_rel_ci=10.0)
    assert len(result.samples) == 10


def test_calls_after_a_slow_flush_are_left_out():
    # the flush before calls 3 and 4 ran 20% slow (the device was disturbed): those calls
    # were slow too, and do not count
    timer = _timer([(0.100, 0.020, 0.008)] * 2 + [(0.140, 0.020, 0.008)] * 2
                   + [(0.100, 0.020, 0.008)] * 4, [])
    timer.flush_ms = [0.084, 0.0842, 0.101, 0.100, 0.0838, 0.084, 0.0841, 0.0843]
    assert timer.kept() == [True, True, False, False, True, True, True, True]
    assert timer.samples() == pytest.approx([0.100] * 6)


def test_calls_queued_after_their_holder_could_open_are_left_out():
    # calls 2 and 5 were queued by a host stalled past the holder's wait: their time counts
    # host time (the GPU waited for the launch after the start event)
    rows = [(0.100, 0.020, 0.008)] * 8
    rows[2] = rows[5] = (0.400, 0.020, 0.008)
    timer = _timer(rows, [])
    timer.flush_ms = [0.084] * 8
    timer.exposed = [False, False, True, False, False, True, False, False]
    assert timer.kept() == [True, True, False, True, True, False, True, True]
    assert timer.samples() == pytest.approx([0.100] * 6) and timer.settled()
    timer.exposed = [True, True, True, False, False, False, False, False]
    assert timer.kept() == [True] * 8  # over a quarter exposed: none left out for it
    assert not timer.settled()  # and measure() times more calls while that lasts


def test_the_slowest_counted_row_is_reported_term_by_term():
    rows = [(0.100, 0.020, 0.008)] * 4
    rows[1] = (0.400, 0.020, 0.008)  # exposed: left out, so not the slowest that counts
    rows[3] = (0.100, 0.020, 0.070)  # the final sync took 62 us longer than idle
    timer = _timer(rows, [])
    timer.flush_ms, timer.queued_ms = [0.084] * 4, [0.01, 0.5, 0.01, 0.02]
    timer.exposed = [False, True, False, False]
    slowest = timer.slowest()
    assert slowest is not None and slowest["row"] == 3
    assert slowest["residual_ms"] == 0.070 and slowest["queued_ms"] == 0.02
    assert slowest["sample_ms"] == pytest.approx(max(timer.samples()))
    assert _timer([], []).slowest() is None


def test_nothing_is_left_out_when_most_flushes_are_slow_or_none_were_timed():
    assert undisturbed([0.084] * 3 + [0.100] * 7) == [True] * 10  # 7 of 10 slow: kept
    assert undisturbed([0.084, 0.0844, 0.0849]) == [True] * 3  # within the 5% margin
    assert undisturbed([]) == []
    timer = _timer([(0.100, 0.020, 0.008)] * 3, [])
    assert timer.kept() == [True] * 3  # rows set without flush times (no flush timed)



def test_worker_stats_carry_the_calls_left_out():
    result = {"samples_ms": [0.1, 0.2, 0.3], "timing_details": {"disturbed": 4}}
    assert timing.worker_stats(result).left_out == 4
    assert timing.worker_stats({"samples_ms": [0.1]}).left_out == 0
    late = {"samples_ms": [0.1, 0.2], "timing_details": {"disturbed": 3, "late": 2}}
    assert (timing.worker_stats(late).left_out, timing.worker_stats(late).late) == (3, 2)


def test_unjoined_calls_are_counted_and_fail_the_verdict():
    from cuda_agent.judge.record import Verdict
    from cuda_agent.judge.verify import _unjoined

    timer = DeviceTimer(Blocker(lambda ns: None, {"full": True}))
    assert timer.unjoined() == 0  # no gate: nothing to count
    timer.spread_ref_ms, timer.spreads = 0.002, [0.002, 0.0049, 0.0051, 0.9]
    assert timer.unjoined() == 2  # over the idle spread by more than UNJOINED_MARGIN_MS
    verdict = Verdict(None, "cuda", 0)
    assert not _unjoined(verdict, {"unjoined": 1, "calls": 10}) and not verdict.reasons
    assert not _unjoined(verdict, {})  # wall time, or no gate
    assert _unjoined(verdict, {"unjoined": 2, "calls": 10}) and not verdict.correct
    assert "another stream" in verdict.reasons[0] and "wait_stream" in verdict.reasons[0]


def test_pooled_is_the_mean_of_process_medians_without_the_extremes():
    parts = [timing.stats(s) for s in ([1.0, 1.1, 1.2], [2.0, 2.1, 2.2], [1.5, 1.6, 1.7])]
    one = timing.pooled(parts[:1])
    assert one is parts[0]
    assert timing.pooled(parts[:2]).median_ms == pytest.approx((1.1 + 2.1) / 2)
    five = [timing.stats([m] * 3) for m in (1.0, 1.02, 1.04, 1.03, 9.0)]
    assert timing.pooled(five).median_ms == pytest.approx((1.02 + 1.03 + 1.04) / 3)
    both = timing.pooled(parts)
    assert both.median_ms == pytest.approx(1.6) and both.processes == 3 and both.runs == 9
    assert both.min_ms == 1.0 and both.max_ms == 2.2
    assert both.mean_ms == pytest.approx((1.1 + 2.1 + 1.6) / 3)
    # the interval spans every process's median: a process apart widens it
    assert both.ci_low_ms <= 1.1 and both.ci_high_ms >= 2.1
    assert timing.pooled([timing.stats([1.0] * 5, 2)] * 2).left_out == 4
    assert timing.pooled([timing.stats([1.0] * 5, 2, 1)] * 3).late == 3
    with pytest.raises(ValueError, match="at least one"):
        timing.pooled([])


def test_the_verdict_table_says_why_calls_were_left_out():
    from cuda_agent.cli.render import _why_left_out

    assert _why_left_out(timing.stats([1.0] * 3, 4)) == ": device disturbed"
    assert _why_left_out(timing.stats([1.0] * 3, 2, 2)) == ": queued late by the host"
    assert _why_left_out(timing.stats([1.0] * 3, 5, 2)) == (
        ": 3 device disturbed, 2 queued late by the host")
