"""Time the calls the judge hands out, the same way for candidate and baselines.

A time has one of two meanings (``TIME_MEANINGS``; ``Measured.meaning`` says which):

- ``device`` (CUDA with the judge's blocker, ``load_blocker``): device-wide GPU time of one
  call, measured in the worker's process (``device_timer``: a gate that holds every SM
  around the call, so host launch overhead is excluded and work on any stream counts).
  The judge holds it to its own clock (``verify.bounded``): a share of the calls are wall
  calls, timed by the judge alone.
- ``wall`` (CPU, or no blocker): per-call wall time in the worker's process, held to the
  judge's own clock (``clock``, ``verify.bounded``) the same way.

Every call's inputs come from a seed the judge sends with it (``source``), made into one
of two buffers that alternate, so neither a cache keyed by pointer nor one keyed by seed
serves a right answer, and any call may be one the judge keeps and checks. Runs repeat
until the 95% confidence interval of the median is within ``target_rel_ci`` (from
``min_runs`` calls on) or the timed calls have taken ``budget_s`` (from ``floor_runs`` on),
so a slow call is timed a few times, not ``min_runs``; the judge holds the worker to the
same rule on its own clock (``driver``). Clocks, events and the synchronise function are
bound at import, before any candidate code runs.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from cuda_agent.judge.device_timer import (
    BUSY_NS,
    IDLE_PROBE_EVERY,
    POST_NS,
    PRE_NS_RANGE,
    Blocker,
    DeviceTimer,
    device_sample,
    load_blocker,
    pre_block_ns,
)
from cuda_agent.judge.source import CallSource
from cuda_agent.results import TimingStats

__all__ = ["TIME_MEANINGS", "L2_FLUSH_BYTES", "MAX_SAMPLES", "PRE_NS_RANGE", "Blocker",
           "CallSource", "DeviceTimer", "Measured", "clean_samples", "device_sample",
           "load_blocker", "measure", "median_ci", "pre_block_ns", "stats", "worker_stats"]

RECORDED_CALLS = 32
"""Calls made inside the activity record, after the timed ones (``measure``'s ``record``).
Short work left on a private stream overran its call in 57 of 100 calls on an H100 (the
others were timed in full): 32 calls miss it with odds of about 1 in 10^11."""

_COMMON = ("L2 flushed before each call on CUDA; each call's inputs made from a seed the judge "
           "sends with the call, into one of two buffers that alternate; median with a 95% "
           "confidence interval")
TIME_MEANINGS = {
    "device": ("device-wide GPU time per call: from when the call's work may start (its "
               "launches, on any stream, queued while a kernel holds every SM, so host launch "
               "overhead is excluded) until work on every stream has finished (work outliving "
               "the calling stream delays a second full-GPU kernel or the final device "
               "synchronisation), held to the judge's own clock (never under its median time "
               "of the wall calls / (1 + clock_margin) - clock_slack_ms); " + _COMMON),
    "wall": ("per-call wall time between device-wide synchronisations (all streams and "
             "threads count), less what the worker spends around a call that does nothing, "
             "held to the judge's own clock (never under its median time of the calls / "
             "(1 + clock_margin) - clock_slack_wall_ms); " + _COMMON),
}
TIME_MEANING = TIME_MEANINGS["wall"]
"""The meaning without a blocker."""
L2_FLUSH_BYTES = 256 * 1024 * 1024
_clock = time.perf_counter
_cuda_sync = torch.cuda.synchronize


MAX_SAMPLES = 100_000
"""The most samples a worker may report (far above any ``max_runs`` in use; a report of
``report.REPORT_BYTES`` holds about 200 000)."""
MAX_SAMPLE_MS = 1e9
"""The longest time a sample may say (about 11 days): their sum stays finite."""


def clean_samples(values: Any) -> list[float] | None:
    """A worker's reported samples (ms) as floats if they are a list of 1 to ``MAX_SAMPLES``
    finite times from 0 to ``MAX_SAMPLE_MS`` (an honest wall sample less the stand-ins'
    cost may be 0); None otherwise (the process's own report: anything may be there)."""
    if type(values) is not list or not 0 < len(values) <= MAX_SAMPLES:
        return None
    if not all(type(x) in (int, float) and 0 <= x <= MAX_SAMPLE_MS for x in values):
        return None  # NaN fails both comparisons
    return [float(x) for x in values]


def median_ci(samples: Sequence[float], z: float = 1.96) -> tuple[float, float]:
    """Distribution-free confidence interval of the median from order statistics
    (``ValueError`` without samples)."""
    ordered = sorted(samples)
    n = len(ordered)
    if not n:
        raise ValueError("median_ci() needs at least one sample")
    half = z * math.sqrt(n) / 2
    lo = max(0, math.floor(n / 2 - half))
    hi = min(n - 1, math.ceil(n / 2 + half) - 1)
    return ordered[lo], ordered[hi]


def stats(samples: Sequence[float], left_out: int = 0, late: int = 0) -> TimingStats:
    lo, hi = median_ci(samples)
    quart = statistics.quantiles(samples, n=4) if len(samples) >= 2 else [samples[0]] * 3
    return TimingStats(statistics.median(samples), min(samples), max(samples),
                       statistics.fmean(samples), len(samples), lo, hi, quart[2] - quart[0],
                       left_out, late=late)


def worker_stats(result: dict[str, Any]) -> TimingStats:
    """The statistics of a worker's raw samples (computed in the judge's process), read as
    ``clean_samples`` reads them, its counts of left-out calls as whole numbers from 0 (any
    other value counts 0); ``ValueError`` where no usable samples were reported (the judge
    refuses such a report first: ``report.report``, ``verify.check_run``)."""
    samples = clean_samples(result.get("samples_ms"))
    if samples is None:
        raise ValueError("the worker reported no usable timing samples")
    details = result.get("timing_details")
    details = details if isinstance(details, dict) else {}
    return stats(samples, _count(details.get("disturbed")), _count(details.get("late")))


def _count(value: Any) -> int:
    return value if type(value) is int and 0 <= value <= MAX_SAMPLES else 0


def pooled(parts: Sequence[TimingStats]) -> TimingStats:
    """One time from the same work timed in several fresh processes: the mean of their
    medians, the lowest and highest left out from three on (on an H100 a 50-90 us kernel's
    per-process median moves by 0.15-0.35% from one process to the next, while each
    process's own interval is 0.2%; a mean of k shrinks that by about 1/sqrt(k), and leaving
    out the extremes keeps one disturbed process from moving it). The interval spans the
    parts' medians and the middle part's interval; runs and left-out calls add up."""
    if not parts:
        raise ValueError("pooled() needs at least one timing")
    if len(parts) == 1:
        return parts[0]
    medians = sorted(p.median_ms for p in parts)
    kept = medians[1:-1] if len(medians) >= 3 else medians
    middle = sorted(parts, key=lambda p: p.median_ms)[len(parts) // 2]
    runs = sum(p.runs for p in parts)
    return TimingStats(
        statistics.fmean(kept), min(p.min_ms for p in parts), max(p.max_ms for p in parts),
        sum(p.mean_ms * p.runs for p in parts) / runs, runs,
        min(medians[0], middle.ci_low_ms), max(medians[-1], middle.ci_high_ms),
        statistics.median(p.iqr_ms for p in parts), sum(p.left_out for p in parts),
        sum(p.processes for p in parts), sum(p.late for p in parts))


@dataclass(frozen=True)
class Measured:
    """What ``measure`` returns: the samples (ms) of the calls it timed itself, the meaning
    (a key of ``TIME_MEANINGS``) and calibration details."""

    samples: list[float]
    meaning: str
    details: dict[str, Any] = field(default_factory=dict)


def measure(fn: Callable[..., Any], source: CallSource, device: str, *, warmup: int = 3,
            min_runs: int = 10, max_runs: int = 500, budget_s: float = 3.0,
            target_rel_ci: float = 0.005, floor_runs: int | None = None,
            blocker: Blocker | None = None,
            warmup_s: float = 0.2, watch: Callable[[], None] | None = None,
            before: Callable[[], None] | None = None, offset_ms: float = 0.0,
            warmed: Callable[[], None] | None = None,
            record: contextlib.AbstractContextManager[Any] | None = None,
            record_calls: int = RECORDED_CALLS) -> Measured:
    """Time ``fn`` over the calls ``source`` hands out: warm-up, timed calls until the
    median's interval is within ``target_rel_ci`` (from ``min_runs`` calls on) or the timed
    calls took ``budget_s`` (from ``floor_runs`` on, ``min_runs`` where None; each call's
    time from receiving it to saying it returned, never more than the judge's own measure
    of it, so the judge agrees the budget is spent), then, with
    ``record`` (the device timer only), ``record_calls`` gated calls inside it (untimed:
    ``details["recorded_calls"]`` says how many went through the gate), then whatever calls
    the source still has (``tail``).

    A ``wall`` call (every call on the CPU) is timed here as the time of ``fn`` and a
    device-wide sync; on CUDA with a ``blocker`` the other calls go through the device timer
    and their samples mean ``device`` time. ``watch`` runs after every call (it raises to
    stop the run)."""
    cuda = device.startswith("cuda")
    flush = _flush_buffer(device)
    timer = DeviceTimer(blocker) if cuda and blocker is not None else None
    samples: list[float] = []  # wall samples; the device timer keeps its own rows
    host: list[float] = []  # warm-up calls' host time (ms), without a sync inside the call
    spent = [0.0]  # the timed calls' own time (s), as ``driver.spent`` counts it
    floor = min_runs if floor_runs is None else min(floor_runs, min_runs)

    def one(phase: str, stop: bool) -> bool:
        """One call of ``phase``; False when the source ends the phase."""
        if source.next(phase, stop) is None:
            return False
        given = _clock()
        if before is not None:
            before()
        if timer is not None and phase == "record":  # recorded, not timed
            inputs = timer.prepare(source.fill, flush, ready=source.ready)
            out = timer.call(fn, inputs)[0]
        elif timer is not None and not source.wall and phase != "warmup":
            inputs = timer.prepare(source.fill, flush, ready=source.ready)
            out = timer.time(fn, inputs)
            if len(timer.rows) % IDLE_PROBE_EVERY == 0:
                timer.prepare(source.fill_local, flush)
                timer.probe_idle()
        else:
            inputs, out, host_ms, wall_ms = _wall_call(fn, source, flush)
            if phase == "warmup":
                host.append(host_ms)
            elif not source.scaled:
                samples.append(max(0.0, wall_ms - offset_ms))
        if watch is not None:
            watch()
        if phase == "timed":
            spent[0] += _clock() - given
        source.done(inputs, out)
        return True

    def count() -> int:
        return len(timer.rows) if timer is not None else len(samples)

    with torch.no_grad():
        began = _clock()
        warm_until = began + (warmup_s if cuda else 0.0)
        while one("warmup", len(host) >= warmup and _clock() >= warm_until):
            pass
        if warmed is not None:
            warmed()
        if timer is not None:
            timer.calibrate(statistics.median(host) if host else 1e9)
        warmed = _clock()
        stop = False
        while one("timed", stop):
            done = count() >= max_runs
            if count() >= floor and (timer is None or timer.probed()):
                counted = timer.samples() if timer is not None else samples
                tight = len(counted) >= min_runs and stats(counted).rel_ci <= target_rel_ci
                done = done or (tight and (timer is None or timer.settled())) \
                    or spent[0] >= budget_s
            stop = done
        window, recorded = 0.0, 0
        if record is not None and timer is not None:
            start = _clock()
            recorded = _recorded(timer, one, record, record_calls)
            window = _clock() - start
        while one("tail", False):
            pass
        spent = {"warmup_seconds": warmed - began,
                 "timed_seconds": _clock() - warmed - window}
        if record is not None and timer is not None:
            spent["activity_seconds"] = window
    if timer is None:
        return Measured(samples, "wall", dict(spent))
    final, kept = timer.samples(), timer.kept()
    rows = [row for row, keep in zip(timer.rows, kept, strict=True) if keep]
    outside = [sample - row[0] for sample, row in zip(final, rows, strict=True)]
    details = {"pre_ns": timer.pre_ns, "post_ns": POST_NS, "busy_ns": BUSY_NS,
               "calls": len(timer.rows), "disturbed": len(kept) - len(rows),
               "exposed": sum(timer.exposed), "late": sum(
                   e and not k for e, k in zip(timer.exposed, kept, strict=True)),
               "gate": timer.spread_ref_ms is not None, "unjoined": timer.unjoined(),
               "gated_calls": timer.gated_calls, "recorded_calls": recorded,
               "wall_calls": len(samples), "spread_ref_ms": timer.spread_ref_ms,
               "spread_ms_max": max(timer.spreads, default=None),
               "flush_ms_median": statistics.median(timer.flush_ms or [0.0]),
               "post_ref_ms": timer.post_ref(), "post_calibration_ms": timer.post_ref_ms,
               "idle_residual_ms": timer.idle_ref_ms(),
               "idle_calibration_ms": timer.idle_ms, "idle_probes": len(timer.idle),
               "host_ms": statistics.median(host or [0.0]), **spent,
               "outside_ms_median": statistics.median(outside) if outside else None,
               "slowest": timer.slowest(), "blocker": timer.blocker.info}
    return Measured(final, "device", details)


def _wall_call(fn: Callable[..., Any], source: CallSource, flush: torch.Tensor | None
               ) -> tuple[list[Any], Any, float, float]:
    """The current call as a wall call: inputs made (and on CUDA the L2 flushed and the
    device idle), the judge's go, the call and a device-wide sync. Returns the inputs, the
    output, the call's host time and its wall time (ms)."""
    inputs = source.fill()
    if flush is not None:
        flush.zero_()
        _cuda_sync()
    source.ready()
    start = _clock()
    out = fn(*inputs)
    queued = _clock() - start
    if flush is not None:
        _cuda_sync()
    return inputs, out, queued * 1e3, (_clock() - start) * 1e3


def wall_calls(fn: Callable[..., Any], source: CallSource, device: str, phase: str,
               before: Callable[[], None] | None = None,
               watch: Callable[[], None] | None = None) -> list[float]:
    """Every call the source hands out in ``phase``, as wall calls, until it ends the phase:
    ``calibrate`` (stand-ins, no candidate code: the judge learns what the protocol itself
    costs) or ``check`` (nothing timed: the judge keeps what it needs). ``before`` and
    ``watch`` as in ``measure``. Returns each call's wall time (ms)."""
    flush = _flush_buffer(device)
    times = []
    with torch.no_grad():
        while source.next(phase) is not None:
            if before is not None:
                before()
            inputs, out, _, wall_ms = _wall_call(fn, source, flush)
            if watch is not None:
                watch()
            source.done(inputs, out)
            times.append(wall_ms)
    return times


def _flush_buffer(device: str) -> torch.Tensor | None:
    if not device.startswith("cuda"):
        return None
    return torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.float32, device=device)


def _recorded(timer: DeviceTimer, one: Callable[[str, bool], bool],
              record: contextlib.AbstractContextManager[Any], calls: int) -> int:
    """``calls`` gated calls inside ``record``: how many went through the gate while it was
    open."""
    before = timer.gated_calls
    with record:
        made = 0
        while one("record", made >= calls):
            made += 1
        through = timer.gated_calls - before
    return through
