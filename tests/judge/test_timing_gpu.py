"""Device-time protocol on a real GPU: the blocker fills the GPU, honest kernels time as with
plain events, and work hidden on other streams still counts. Run on a GPU machine:
``pytest -m gpu tests/judge/test_timing_gpu.py`` (builds the CUDA fixed layer once)."""

from __future__ import annotations

import statistics
import time

import pytest
import torch

from cuda_agent.build import BuildConfig, Builder, load_extension
from cuda_agent.judge.device_timer import IDLE_PROBES_MIN
from cuda_agent.judge.timing import (
    L2_FLUSH_BYTES,
    Blocker,
    CallSource,
    load_blocker,
    measure,
    stats,
)

pytestmark = pytest.mark.gpu

N = 1 << 25  # sin over 32M floats: 256 MB of traffic, about 0.1 ms on an H100
OPTIONS = {"budget_s": 2.0, "max_runs": 2000}


@pytest.fixture(scope="module")
def blocker() -> Blocker:
    module = load_extension(Builder(BuildConfig(device="cuda")).build_tracer())
    found = load_blocker(module)
    assert found is not None, module._blocker_info()
    return found


def rotation(n: int = N) -> CallSource:
    """Fresh inputs for every call, as the judge's calls have (a local source: no judge)."""
    def variant(seed: int, scale: float) -> list[torch.Tensor]:
        gen = torch.Generator(device="cuda").manual_seed(seed % 2**63)
        return [torch.randn(n, device="cuda", generator=gen) * scale]

    return CallSource(variant)


def median_ms(fn, blocker: Blocker | None, n: int = N, **options) -> float:
    result = measure(fn, rotation(n), "cuda", blocker=blocker, **OPTIONS, **options)
    assert result.meaning == ("device" if blocker else "wall")
    return stats(result.samples).median_ms


def events_ms(fn, calls: int = 200) -> float:
    """Plain events on the calling stream, host running ahead (honest fn only)."""
    inputs = rotation().fill()
    flush = torch.empty(L2_FLUSH_BYTES // 4, device="cuda")
    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
             for _ in range(calls)]
    for start, end in pairs:
        flush.zero_()
        start.record()
        fn(*inputs)
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in pairs[calls // 10:])


def test_a_call_queued_late_is_left_out_and_the_holder_waits_longer(blocker: Blocker):
    """A host that stalls 300 us before launching, in one call of seven: those calls would
    count the stall (the holder opens after about 50 us); they are left out and the holder's
    wait doubles until it covers the stall."""
    calls = [0]

    def stalling(x: torch.Tensor) -> torch.Tensor:
        calls[0] += 1
        if calls[0] % 7 == 0:
            time.sleep(0.0003)
        return torch.sin(x)

    base = median_ms(torch.sin, blocker)
    # at least 60 calls: enough stalls for the wait to grow (a run may otherwise stop at
    # its interval after 10-20 calls, with one or two stalls left out)
    result = measure(stalling, rotation(), "cuda", blocker=blocker, min_runs=60, **OPTIONS)
    why = {k: result.details[k] for k in ("calls", "exposed", "late", "pre_ns", "disturbed",
                                          "slowest", "post_ref_ms", "idle_residual_ms")}
    why = str(why)  # whole: pytest shortens a dict
    assert result.details["exposed"] >= 2 and result.details["pre_ns"] >= 300_000, why
    # no sample counts a stall (one would be the slowest: a stall adds 300-550 us to the call's
    # own term); the final sync's host time may still add tens of us to a rare sample
    slowest = result.details["slowest"]
    assert slowest["main_ms"] < 1.5 * base, why
    assert sum(s > 1.5 * base for s in result.samples) <= 2, why
    assert stats(result.samples).median_ms == pytest.approx(base, rel=0.03)


def test_the_recorded_calls_go_through_the_gate_untimed(blocker: Blocker):
    """The calls inside ``record`` come after the timed ones, each through the gate, and
    none of them is a sample (recording changes how some kernels run)."""
    import contextlib

    inputs = rotation()
    seen: dict[str, int] = {}

    @contextlib.contextmanager
    def record():
        seen["before"] = inputs.filled
        yield
        seen["after"] = inputs.filled

    result = measure(lambda x: x[:1024].clone(), inputs, "cuda", blocker=blocker,
                     min_runs=10, budget_s=0.5, record=record(), record_calls=8)
    assert result.details["recorded_calls"] == 8, result.details
    assert seen["after"] - seen["before"] == 8
    assert result.details["calls"] == len(result.samples) + result.details["disturbed"]

def test_blocker_fills_every_sm(blocker: Blocker):
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    info = blocker.info
    assert info["full"] and info["sm_count"] == props.multi_processor_count
    assert (info["threads_per_block"] * info["blocks_per_sm"]
            == props.max_threads_per_multi_processor)
    assert info["resident_blocks_per_sm"] >= info["blocks_per_sm"]


def test_blocker_holds_back_other_streams(blocker: Blocker):
    side = torch.cuda.Stream()
    x = torch.ones(1024, device="cuda")
    begin, own, other = (torch.cuda.Event(enable_timing=True) for _ in range(3))
    torch.cuda.synchronize()
    begin.record()
    blocker.block(1_000_000)
    own.record()
    with torch.cuda.stream(side):
        x.add_(1)  # a tiny kernel on a non-blocking stream cannot start beside the blocker
        other.record()
    torch.cuda.synchronize()
    assert 0.95 <= begin.elapsed_time(own) <= 1.2
    assert begin.elapsed_time(other) >= 0.95


def test_gate_holds_every_stream_until_the_start_event(blocker: Blocker):
    assert blocker.gate, blocker.info
    side, own = torch.cuda.Stream(), torch.cuda.Stream()
    x = torch.ones(1024, device="cuda")
    begin, start, other = (torch.cuda.Event(enable_timing=True) for _ in range(3))
    torch.cuda.synchronize()
    begin.record()
    blocker.arm(1_000_000, own)
    time.sleep(0.0002)  # the holder is resident
    with torch.cuda.stream(side):
        x.add_(1)  # queued while the gate is shut, on a stream that does not wait for ours
        other.record()
    start.record()
    blocker.open()
    torch.cuda.synchronize()
    assert 0.95 <= begin.elapsed_time(start) <= 1.2  # the calling stream waited for the holder
    assert 0 <= start.elapsed_time(other) <= 0.05  # released at the start event, not before


def test_honest_kernel_device_time(blocker: Blocker):
    result = measure(torch.sin, rotation(), "cuda", blocker=blocker, **OPTIONS)
    assert result.meaning == "device"
    assert {"pre_ns", "post_ref_ms", "idle_residual_ms", "blocker"} <= set(result.details)
    assert result.details["idle_probes"] >= IDLE_PROBES_MIN
    assert result.details["idle_residual_ms"] < 0.1, result.details  # an idle sync: microseconds
    device = stats(result.samples).median_ms
    plain = events_ms(torch.sin)
    assert 0.9 * plain <= device <= 1.15 * plain, (device, plain, result.details)
    assert result.details["outside_ms_median"] < 0.05 * device


def test_private_stream_not_joined_still_counts(blocker: Blocker):
    side = torch.cuda.Stream()

    def hostile(x: torch.Tensor) -> torch.Tensor:
        with torch.cuda.stream(side):
            return torch.sin(x)  # returns before the work is done, never joined

    honest = median_ms(torch.sin, blocker)
    assert median_ms(hostile, blocker) >= 0.8 * honest


def test_unjoined_private_stream_is_seen_or_still_timed(blocker: Blocker):
    side = torch.cuda.Stream()

    def hostile(x: torch.Tensor) -> torch.Tensor:
        with torch.cuda.stream(side):
            return torch.sin(x)

    big = measure(hostile, rotation(N), "cuda", blocker=blocker, **OPTIONS).details
    assert big["gate"] and big["unjoined"] >= 0.9 * big["calls"], big  # 0.1 ms: every call
    for n in (N, 1 << 21):
        honest = measure(torch.sin, rotation(n), "cuda", blocker=blocker, **OPTIONS)
        assert honest.details["unjoined"] <= 0.02 * honest.details["calls"], honest.details
    # 2M floats (10 us) ends too soon after the calling stream to be seen (docs/judge.md,
    # Limits); judge-v8 times it at about 70% of honest, judge-v7 at 25%
    assert median_ms(hostile, blocker, 1 << 21) >= 0.6 * median_ms(torch.sin, blocker, 1 << 21)


def test_side_stream_joined_at_the_end_gains_no_head_start(blocker: Blocker):
    side, n = torch.cuda.Stream(), 1 << 21  # sin over 2M floats: about 12 us on an H100

    def early(x: torch.Tensor) -> torch.Tensor:
        with torch.cuda.stream(side):
            y = torch.sin(x)
        torch.cuda.current_stream().wait_stream(side)
        return y

    # a blocker on the calling stream before ev0 (judge-v7) let work on another stream start
    # about 8 us before ev0: sin over 2M floats, 12 us, was timed at 1.6 us unjoined
    assert median_ms(early, blocker, n) >= 0.9 * median_ms(torch.sin, blocker, n)


def test_side_stream_cannot_overlap_the_flush(blocker: Blocker):
    side = torch.cuda.Stream()

    def early(x: torch.Tensor) -> torch.Tensor:
        # starts at once on a stream that does not wait for ours (where the flush ran)
        with torch.cuda.stream(side):
            y = torch.sin(x)
        torch.cuda.current_stream().wait_stream(side)
        return y

    honest = median_ms(torch.sin, blocker)
    assert median_ms(early, blocker) >= 0.8 * honest


@pytest.mark.xfail(strict=False, reason="copy engines are not held by the blocker: a copy on "
                   "a private stream may run during blocker_pre (bounded by its length)")
def test_copy_engine_on_private_stream(blocker: Blocker):
    side = torch.cuda.Stream()

    def copy(x: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(x).copy_(x)

    def hostile(x: torch.Tensor) -> torch.Tensor:
        with torch.cuda.stream(side):
            return copy(x)

    assert median_ms(hostile, blocker) >= 0.8 * median_ms(copy, blocker)


def test_spread_within_one_process(blocker: Blocker):
    # at the judge's CUDA target interval (0.2%); at 0.5% five medians spread 1.04% once
    medians = [median_ms(torch.sin, blocker, target_rel_ci=0.002) for _ in range(5)]
    spread = (max(medians) - min(medians)) / statistics.median(medians)
    assert spread <= 0.01, medians


def test_without_blocker_wall_time_is_kept():
    assert median_ms(torch.sin, None) > 0
