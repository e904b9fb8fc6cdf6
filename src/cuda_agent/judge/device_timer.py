"""The judge's ``device`` timing protocol on CUDA (``timing.measure`` drives it).

The blocker (``build/judge_timer.cu``, linked into every CUDA module the judge builds) is a
kernel that fills every thread slot of every SM for a set time; while it runs no other
kernel, on any stream, can start. Per call, after the inputs are refilled and the L2 cache
flushed: ``blocker_pre``, event ``ev0``, the call, ``ev1``, ``blocker_post``, ``ev2``; wait
for ``ev2``, then time a device-wide synchronisation. A sample is elapsed(ev0, ev1) plus how
much ``blocker_post`` was delayed (work still running after the calling stream is done) plus
how much the final sync took over the idle reference (work queued later); see
``device_sample``. A call whose L2 flush, timed just before it with no candidate code on the
GPU, ran markedly slower than the run's usual flush is left out (``undisturbed``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

PRE_NS_RANGE = (50_000, 2_000_000)
POST_NS = 20_000
CALIBRATION_CALLS = 40
TAIL_SLACK_MS = 0.0005
BUSY_NS = 300_000
"""The blocker that holds the GPU while the host prepares the next call."""
IDLE_PROBE_EVERY = 3
"""One idle probe (``DeviceTimer.probe_idle``) after every this many timed calls."""
IDLE_PROBES_MIN = 5
DISTURBED_MARGIN = 0.05
"""A call is disturbed when the flush before it took this much longer than the run's usual
flush (its 20th percentile). Measured on an H100: episodes of a slower device (no clock or
throttle change seen by NVML) slowed the flush by 15-25% and the calls with it by 3-150%;
undisturbed flushes varied by under 1%."""
DISTURBED_MAX_SHARE = 0.5
"""If more calls than this share are disturbed, none is left out (the device is just slow)."""
_clock = time.perf_counter
_cuda_sync = torch.cuda.synchronize
_Event = torch.cuda.Event
_record, _elapsed = torch.cuda.Event.record, torch.cuda.Event.elapsed_time
_event_sync = torch.cuda.Event.synchronize


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Blocker:
    """The judge's full-GPU kernel from the fixed layer (``_block_device``), bound at load."""

    def __init__(self, block: Callable[[int], None], info: dict[str, Any]):
        self._block = block
        self.info = dict(info)

    def block(self, ns: int) -> None:
        self._block(int(ns))


def load_blocker(module: Any) -> Blocker | None:
    """The blocker of a built module (extension or tracer), or None when it has none or the
    blocker cannot fill every SM of the current device. Call before candidate code runs."""
    block, info = getattr(module, "_block_device", None), getattr(module, "_blocker_info", None)
    if not callable(block) or not callable(info):
        return None
    try:
        details = dict(info())
    except Exception:  # no CUDA device, or the device refuses the query
        return None
    return Blocker(block, details) if details.get("full") else None


def undisturbed(flush_ms: list[float]) -> list[bool]:
    """Which calls to keep, from the time of the L2 flush before each (the judge's own work
    on an otherwise idle GPU): those within ``DISTURBED_MARGIN`` of the run's usual flush."""
    if not flush_ms:
        return []
    usual = _percentile(flush_ms, 0.2)
    keep = [f <= usual * (1 + DISTURBED_MARGIN) for f in flush_ms]
    if sum(keep) < (1 - DISTURBED_MAX_SHARE) * len(keep):
        return [True] * len(keep)
    return keep


def device_sample(main_ms: float, tail_ms: float, residual_ms: float, post_ref_ms: float,
                  idle_residual_ms: float) -> float:
    """One ``device`` sample: elapsed(ev0, ev1), plus how much ``blocker_post`` was delayed
    (elapsed(ev1, ev2) over the longest it took alone, plus a slack), plus how much the final
    device sync took over the longest it took on an idle GPU (work queued after ``ev2``)."""
    return (main_ms + max(0.0, tail_ms - post_ref_ms)
            + max(0.0, residual_ms - idle_residual_ms))


def pre_block_ns(host_ms: float) -> int:
    """``blocker_pre``'s length: twice the host time of one call plus 20 us, clamped."""
    low, high = PRE_NS_RANGE
    return int(min(high, max(low, 2 * host_ms * 1e6 + 20_000)))


class DeviceTimer:
    """The per-call ``device`` protocol (after the flush and the device-wide sync).

    Between calls the GPU is kept busy (``prepare``) while the host refills the inputs:
    measured on an H100, letting it idle there moved a 50 us kernel's per-process median by
    up to 1.2% from one process to the next; keeping it busy, by at most 0.3-0.7%. The
    final sync's idle time is re-measured during the run (``probe_idle``: the same sequence
    around a blocker as long as the call, no candidate code), not only before it."""

    def __init__(self, blocker: Blocker):
        self.blocker = blocker
        self.events: list[Any] = []  # made at the first call (CUDA builds only)
        self.pre_ns = PRE_NS_RANGE[1]
        self.post_ref_ms = 0.0
        self.idle_ms = 0.0
        self.rows: list[tuple[float, float, float]] = []
        self.idle: list[float] = []
        self.flush_ms: list[float] = []  # the flush before each row's call
        self._flush_events: list[Any] = []
        self._last_flush_ms = 0.0

    def call(self, fn: Callable[..., Any], inputs: list[Any]
             ) -> tuple[Any, float, float, float]:
        """Return the output, elapsed(ev0, ev1), elapsed(ev1, ev2) and the residual (ms)."""
        if not self.events:
            self.events = [_Event(enable_timing=True) for _ in range(3)]
        ev0, ev1, ev2 = self.events
        self.blocker.block(self.pre_ns)
        _record(ev0)
        out = fn(*inputs)
        _record(ev1)
        self.blocker.block(POST_NS)
        _record(ev2)
        _event_sync(ev2)
        start = _clock()
        _cuda_sync()
        residual = (_clock() - start) * 1e3
        return out, _elapsed(ev0, ev1), _elapsed(ev1, ev2), residual

    def calibrate(self, host_ms: float) -> None:
        """Set ``blocker_pre`` from the call's host time; measure ``blocker_post`` alone and
        the device sync on an idle GPU."""
        self.pre_ns = PRE_NS_RANGE[0]
        tails, residuals = [], []
        for _ in range(CALIBRATION_CALLS):
            _cuda_sync()
            _, _, tail, residual = self.call(lambda: None, [])
            tails.append(tail)
            residuals.append(residual)
        # high percentiles, not medians: a one-sided term at the median adds noise to half
        # the samples; not maxima either: one outlier would hide work that delays the tail
        self.post_ref_ms = _percentile(tails, 0.9) + TAIL_SLACK_MS
        self.idle_ms = _percentile(residuals, 0.9)
        self.pre_ns = pre_block_ns(host_ms)

    def prepare(self, rotation: Any, index: int | None, flush: torch.Tensor
                ) -> tuple[list[Any], int]:
        """The next call's inputs (``rotation.prepare``) refilled and the L2 cache flushed
        while a blocker keeps the GPU busy; returns on an idle GPU."""
        if not self._flush_events:
            self._flush_events = [_Event(enable_timing=True) for _ in range(2)]
        start, end = self._flush_events
        _cuda_sync()
        self.blocker.block(BUSY_NS)
        inputs, k = rotation.prepare(index)
        _record(start)
        flush.zero_()
        _record(end)
        _cuda_sync()
        self._last_flush_ms = _elapsed(start, end)
        return inputs, k

    def time(self, fn: Callable[..., Any], inputs: list[Any]) -> Any:
        out, main, tail, residual = self.call(fn, inputs)
        self.rows.append((main, tail, residual))
        self.flush_ms.append(self._last_flush_ms)
        return out

    def kept(self) -> list[bool]:
        """Which rows count (``undisturbed``; all of them when no flush was timed)."""
        if len(self.flush_ms) != len(self.rows):
            return [True] * len(self.rows)
        return undisturbed(self.flush_ms)

    def probe_idle(self) -> None:
        """The call's sequence around a stand-in of the same device time: the final sync's
        time on a GPU that the call would leave idle, under this run's conditions."""
        spin_ns = max(1_000, int(statistics.median(r[0] for r in self.rows) * 1e6))
        self.idle.append(self.call(lambda: self.blocker.block(spin_ns), [])[3])

    def probed(self) -> bool:
        """Whether enough idle probes exist for the run's own reference."""
        return len(self.idle) >= IDLE_PROBES_MIN

    def idle_ref_ms(self) -> float:
        """The sync's idle reference: the 90th percentile of the probes (calibration's until
        there are a few)."""
        return _percentile(self.idle, 0.9) if self.probed() else self.idle_ms

    def samples(self) -> list[float]:
        """The samples of the rows that count, in order."""
        idle = self.idle_ref_ms()
        return [device_sample(main, tail, residual, self.post_ref_ms, idle)
                for (main, tail, residual), keep in zip(self.rows, self.kept(), strict=True)
                if keep]
