"""The judge's ``device`` timing protocol on CUDA (``timing.measure`` drives it).

The fixed layer's device timer (``build/judge_timer.cu``, linked into every CUDA module the
judge builds) has kernels that fill every thread slot of every SM, so that while they run no
other kernel, on any stream, can start. Per call, after the inputs are refilled and the L2
cache flushed, through the gate (judge-v8): a holder on the timer's own stream fills the GPU
and the calling stream waits until it has run ``pre_ns``; event ``ev0``; the calling stream
releases the holder; the call; ``ev1``; the own stream waits for ``ev1``, then runs
``blocker_post`` (its block starts noted) and ``ev2``; wait for ``ev2``, then time a
device-wide synchronisation. A sample is elapsed(ev0, ev1) plus how much ``blocker_post``
was delayed (work still running after the calling stream is done) plus how much the final
sync took over the idle reference (work queued later); see ``device_sample``. A post whose
block starts spread wider than on an idle GPU marks a call that left work running on
another stream (``DeviceTimer.unjoined``; the verdict fails). Where the driver lacks the
stream memory operations, blockers on the calling stream stand before ``ev0`` and after
``ev1`` instead (judge-v7). A call whose L2 flush, timed just before it with no candidate
code on the GPU, ran markedly slower than the run's usual flush is left out
(``undisturbed``).
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
UNJOINED_MARGIN_MS = 0.003
"""A call left work running on another stream when ``blocker_post``'s block starts spread
this much wider than on an idle GPU (the calibration's 90th percentile)."""
EXPOSED_MARGIN_NS = 10_000
"""A call is exposed when the host finished queuing it (``ev1`` recorded) later than this
before the holder's ``pre_ns`` had run from when the host armed it: the holder may then have
opened before the call's last launch reached the GPU, and the call's time would count host
time. The GPU is idle when the holder is armed, so it starts within microseconds of that."""
EXPOSED_MAX_SHARE = 0.25
"""If more timed calls than this share are exposed, none is left out for it (only
``pre_ns`` grows)."""
EXPOSED_WINDOW = 8
"""Two exposed calls among this many recent ones double ``pre_ns`` (up to its maximum)."""
_clock = time.perf_counter
_cuda_sync = torch.cuda.synchronize
_Event = torch.cuda.Event
_record, _elapsed = torch.cuda.Event.record, torch.cuda.Event.elapsed_time
_event_sync = torch.cuda.Event.synchronize
_Stream = torch.cuda.Stream
_wait_event = torch.cuda.Stream.wait_event


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Blocker:
    """The judge's full-GPU kernels from the fixed layer (``_block_device``; where the device
    has the gate, ``_gate_arm``, ``_gate_open``, ``_gate_close`` and ``_post_spread``), bound
    at load."""

    def __init__(self, block: Callable[[int], None], info: dict[str, Any],
                 gate: dict[str, Callable[..., Any]] | None = None):
        self._block = block
        self.info = dict(info)
        self._gate = gate if info.get("gate") else None

    def block(self, ns: int) -> None:
        self._block(int(ns))

    @property
    def gate(self) -> bool:
        """Whether calls can start through the gate (``arm``, ``open``) and end with a
        ``post`` that notes its blocks' starts."""
        return self._gate is not None

    def _op(self, name: str) -> Callable[..., Any]:
        if self._gate is None:
            raise RuntimeError("the judge timer has no gate on this device")
        return self._gate[name]

    def arm(self, ns: int, own_stream: Any) -> None:
        """Hold every SM from ``own_stream``; the current stream waits ``ns`` for it."""
        self._op("arm")(int(ns), int(own_stream.cuda_stream))

    def open(self) -> None:
        """Release the holder from the stream the gate was armed on."""
        self._op("open")()

    def close(self, ns: int) -> None:
        """``blocker_post`` for ``ns`` on the holder's stream, noting when each of its blocks
        started; make that stream wait for the calling stream first."""
        self._op("close")(int(ns))

    def post_spread_ms(self) -> float | None:
        """The last ``close``'s first-to-last block start (ms), once it has finished."""
        spread = int(self._op("spread")())
        return spread / 1e6 if spread >= 0 else None


GATE_OPS = {"arm": "_gate_arm", "open": "_gate_open", "close": "_gate_close",
            "spread": "_post_spread"}


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
    ops = {key: getattr(module, name, None) for key, name in GATE_OPS.items()}
    gate = ops if all(callable(op) for op in ops.values()) else None
    return Blocker(block, details, gate) if details.get("full") else None


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
    """How long the calling stream waits before ``ev0`` (the gate's holder, or
    ``blocker_pre``): twice the host time of one call plus 20 us, clamped."""
    low, high = PRE_NS_RANGE
    return int(min(high, max(low, 2 * host_ms * 1e6 + 20_000)))


class DeviceTimer:
    """The per-call ``device`` protocol (after the flush and the device-wide sync).

    Between calls the GPU is kept busy (``prepare``) while the host refills the inputs:
    measured on an H100, letting it idle there moved a 50 us kernel's per-process median by
    up to 1.2% from one process to the next; keeping it busy, by at most 0.3-0.7%. The
    final sync's idle time is re-measured during the run (``probe_idle``: the same sequence
    around a blocker as long as the call, no candidate code), not only before it."""

    def __init__(self, blocker: Blocker, gate: bool = True):
        """``gate``: start calls through the gate where the device has it (without it,
        blockers on the calling stream stand before ``ev0`` and after ``ev1``: on an H100
        ``ev0`` was then recorded about 8 us after the blocker had freed the SMs, and a
        kernel on a private stream ran in that time)."""
        self.blocker = blocker
        self.gate = gate
        self.events: list[Any] = []  # made at the first call (CUDA builds only)
        self.pre_ns = PRE_NS_RANGE[1]
        self.post_ref_ms = 0.0
        self.idle_ms = 0.0
        self.rows: list[tuple[float, float, float]] = []
        self.idle: list[float] = []
        self.idle_tails: list[float] = []  # blocker_post's time in the idle probes
        self.flush_ms: list[float] = []  # the flush before each row's call
        self.exposed: list[bool] = []  # each row's call: queued after its holder could open
        self.queued_ms: list[float] = []  # each row's call: host time from arming to ev1
        self._last_exposed = False
        self._last_queued_ms = 0.0
        self.gated_calls = 0  # calls through the gate (calibration and idle probes too)
        self._flush_events: list[Any] = []
        self._last_flush_ms = 0.0
        self._own: Any = None  # the gate's holder stream, made at the first call
        self.spreads: list[float] = []  # each row's post spread (ms; with the gate)
        self.spread_ref_ms: float | None = None
        self._last_spread: float | None = None

    def call(self, fn: Callable[..., Any], inputs: list[Any]
             ) -> tuple[Any, float, float, float]:
        """Return the output, elapsed(ev0, ev1), elapsed(ev1, ev2) and the residual (ms)."""
        if not self.events:
            self.events = [_Event(enable_timing=True) for _ in range(3)]
        ev0, ev1, ev2 = self.events
        gated = self.gate and self.blocker.gate
        armed = _clock()
        if gated:
            self.gated_calls += 1
            self._own = self._own or _Stream()  # the holder's stream
            self.blocker.arm(self.pre_ns, self._own)
            _record(ev0)
            self.blocker.open()
        else:
            self.blocker.block(self.pre_ns)
            _record(ev0)
        out = fn(*inputs)
        _record(ev1)
        queued = _clock() - armed
        self._last_queued_ms = queued * 1e3
        self._last_exposed = queued * 1e9 > self.pre_ns - EXPOSED_MARGIN_NS
        if gated:
            _wait_event(self._own, ev1)
            self.blocker.close(POST_NS)
            _record(ev2, self._own)
        else:
            self.blocker.block(POST_NS)
            _record(ev2)
        _event_sync(ev2)
        start = _clock()
        _cuda_sync()
        residual = (_clock() - start) * 1e3
        self._last_spread = self.blocker.post_spread_ms() if gated else None
        return out, _elapsed(ev0, ev1), _elapsed(ev1, ev2), residual

    def calibrate(self, host_ms: float) -> None:
        """Set the wait before ``ev0`` from the call's host time; measure ``blocker_post``
        alone and the device sync on an idle GPU."""
        self.pre_ns = PRE_NS_RANGE[0]
        tails, residuals, spreads = [], [], []
        for _ in range(CALIBRATION_CALLS):
            _cuda_sync()
            _, _, tail, residual = self.call(lambda: None, [])
            tails.append(tail)
            residuals.append(residual)
            if self._last_spread is not None:
                spreads.append(self._last_spread)
        self.spread_ref_ms = _percentile(spreads, 0.9) if spreads else None
        # high percentiles, not medians: a one-sided term at the median adds noise to half
        # the samples; not maxima either: one outlier would hide work that delays the tail
        self.post_ref_ms = _percentile(tails, 0.9) + TAIL_SLACK_MS
        self.idle_ms = _percentile(residuals, 0.9)
        self.pre_ns = pre_block_ns(host_ms)

    def prepare(self, fill: Callable[[], list[Any]], flush: torch.Tensor,
                ready: Callable[[], None] | None = None) -> list[Any]:
        """The next call's inputs (``fill``) made and the L2 cache flushed while a blocker
        keeps the GPU busy; ``ready`` (the call protocol's exchange with the judge) runs
        while the GPU is still busy with them; returns on an idle GPU."""
        if not self._flush_events:
            self._flush_events = [_Event(enable_timing=True) for _ in range(2)]
        start, end = self._flush_events
        _cuda_sync()
        self.blocker.block(BUSY_NS)
        inputs = fill()
        _record(start)
        flush.zero_()
        _record(end)
        if ready is not None:
            ready()
        _cuda_sync()
        self._last_flush_ms = _elapsed(start, end)
        return inputs

    def time(self, fn: Callable[..., Any], inputs: list[Any]) -> Any:
        out, main, tail, residual = self.call(fn, inputs)
        self.rows.append((main, tail, residual))
        self.flush_ms.append(self._last_flush_ms)
        self.exposed.append(self._last_exposed)
        self.queued_ms.append(self._last_queued_ms)
        if self._last_spread is not None:
            self.spreads.append(self._last_spread)
        if self._last_exposed and sum(self.exposed[-EXPOSED_WINDOW:]) >= 2:
            self.pre_ns = min(PRE_NS_RANGE[1], 2 * self.pre_ns)
        return out

    def unjoined(self) -> int:
        """How many timed calls left work running on another stream after the calling stream
        was done (their post's block starts spread wider than on an idle GPU)."""
        if self.spread_ref_ms is None:
            return 0
        return sum(s > self.spread_ref_ms + UNJOINED_MARGIN_MS for s in self.spreads)

    def settled(self) -> bool:
        """Whether few enough timed calls were exposed for them to be left out: at most
        ``EXPOSED_MAX_SHARE``. A run goes on while more were (``pre_ns`` grows meanwhile)."""
        return sum(self.exposed) <= EXPOSED_MAX_SHARE * len(self.rows)

    def kept(self) -> list[bool]:
        """Which rows count: ``undisturbed`` (all of them when no flush was timed), and not
        exposed (unless over ``EXPOSED_MAX_SHARE`` of them were)."""
        keep = ([True] * len(self.rows) if len(self.flush_ms) != len(self.rows)
                else undisturbed(self.flush_ms))
        if len(self.exposed) == len(self.rows) and self.settled():
            keep = [k and not e for k, e in zip(keep, self.exposed, strict=True)]
        return keep

    def probe_idle(self) -> None:
        """The call's sequence around a stand-in of the same device time: the final sync's
        time on a GPU that the call would leave idle, under this run's conditions."""
        spin_ns = max(1_000, int(statistics.median(r[0] for r in self.rows) * 1e6))
        _, _, tail, residual = self.call(lambda: self.blocker.block(spin_ns), [])
        self.idle.append(residual)
        self.idle_tails.append(tail)

    def probed(self) -> bool:
        """Whether enough idle probes exist for the run's own reference."""
        return len(self.idle) >= IDLE_PROBES_MIN

    def idle_ref_ms(self) -> float:
        """The sync's idle reference: the 90th percentile of the probes (calibration's until
        there are a few)."""
        return _percentile(self.idle, 0.9) if self.probed() else self.idle_ms

    def post_ref(self) -> float:
        """``blocker_post``'s reference: the 90th percentile of its time in the idle probes
        plus a slack (calibration's until there are a few). Through the gate the post waits
        on the judge's stream for an event after the call, which took longer after a kernel
        than after calibration's empty calls: honest calls gained about 0.5 us there."""
        if not self.probed() or not self.idle_tails:
            return self.post_ref_ms
        return _percentile(self.idle_tails, 0.9) + TAIL_SLACK_MS

    def slowest(self) -> dict[str, Any] | None:
        """The slowest row that counts, term by term (ms), for reports: which part of the
        protocol a slow sample came from."""
        counted = [k for k, keep in enumerate(self.kept()) if keep]
        if not counted:
            return None
        sample, k = max(zip(self.samples(), counted, strict=True))
        main, tail, residual = self.rows[k]
        return {"row": k, "sample_ms": sample, "main_ms": main, "tail_ms": tail,
                "residual_ms": residual,
                "flush_ms": self.flush_ms[k] if k < len(self.flush_ms) else None,
                "queued_ms": self.queued_ms[k] if k < len(self.queued_ms) else None}

    def samples(self) -> list[float]:
        """The samples of the rows that count, in order."""
        idle = self.idle_ref_ms()
        post_ref = self.post_ref()
        return [device_sample(main, tail, residual, post_ref, idle)
                for (main, tail, residual), keep in zip(self.rows, self.kept(), strict=True)
                if keep]
