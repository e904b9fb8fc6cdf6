"""Times from the judge's own clock: what a worker's calls took, as the judge saw them.

For each call the judge noted when it sent the call (the seed), when the worker said
``ready`` (inputs made), when it sent ``go`` and when the worker said ``done`` (outputs and
inputs packed) (``driver.Record``). The worker's first calls, before any candidate code was
loaded, are stand-ins (``calibrate``): the same steps around a call that only allocates its
output, so they give what the protocol itself costs in this process, on this machine, now.
A wall call's time is then

    (done - go) - the stand-ins' median (done - go)
    + how much longer the counted calls' median preparation took than the stand-ins'
      (work begun on seeing the seed, before ``ready``).

Medians over the counted calls alone (not the warm-up's, which the worker could make as
many as it likes): on a loaded machine any one call may stall, and a candidate that works
before ``ready`` in most counted calls moves the median, while one that does so in fewer
leaves most calls' own time to set the median of the samples.

The wall clock sees only the main thread's steps: another thread can work outside the
window (go, done], or inside it beside the worker's own steps that the stand-ins' time
takes out (the packing). So the judge also reads the process's CPU time (``cpu_clock``)
when it sends a call and when it answers the worker's next ``need``: the call's cycle. The
CPU time every thread but the main one spent in a counted call's cycle, beyond the
stand-ins' median, over the threads the process may keep busy at once
(``cpu_clock.thread_budget``), is a time too, and a call's time is the larger of the two:

    a counted call's time >= (other threads' CPU time in its cycle - the stand-ins')
                             / thread budget.

The main thread runs one thing at a time: what it does between go and done is in the
wall time, before ``ready`` in the preparation charge, and after ``done`` the call's
outputs are packed and the next call's inputs do not exist. So whatever a thread of the
process does while a call can still use it is charged to that call, as if spread over at
most the budget's threads; an honest kernel whose threads work inside the call keeps its
wall time (its other threads' CPU time over the budget is at most that).

Nothing here comes from the worker's process except the order of its messages.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from cuda_agent.judge import driver
from cuda_agent.judge.driver import Record

COUNTED = tuple(phase for phase in driver.COUNTED if phase != "check")
"""Phases whose wall calls count: the driver's counted ones that are timed (warm-up calls
are slower by nature, and a ``check`` call is not timed)."""


@dataclass(frozen=True)
class JudgeClock:
    """A worker's call times by the judge's clock (ms), and the stand-ins' references."""

    samples_ms: tuple[float, ...]
    """Each counted wall call's time."""
    call_ref_ms: float
    """The stand-ins' median (done - go): the protocol's own cost of a call."""
    prepare_ref_ms: float
    """The stand-ins' median (ready - sent)."""
    early_ms: float
    """The counted calls' median preparation beyond ``prepare_ref_ms`` (>= 0)."""
    kept: int
    """Calls the judge kept and read."""
    cpu_ref_ms: float | None = None
    """The stand-ins' median CPU time of a cycle; None where the judge could not read the
    process's CPU time (then the wall clock alone times the calls)."""
    threads: int = 1
    """The thread budget the CPU time is spread over."""
    cpu_bound: int = 0
    """Counted calls whose CPU time, not their wall time, set their time."""

    @property
    def median_ms(self) -> float | None:
        return statistics.median(self.samples_ms) if self.samples_ms else None

    def details(self) -> dict[str, float | int | None]:
        return {"judge_median_ms": self.median_ms, "judge_calls": len(self.samples_ms),
                "judge_call_ref_ms": self.call_ref_ms,
                "judge_prepare_ref_ms": self.prepare_ref_ms, "judge_early_ms": self.early_ms,
                "judge_kept": self.kept, "judge_cpu_ref_ms": self.cpu_ref_ms,
                "judge_threads": self.threads, "judge_cpu_bound": self.cpu_bound}


class ClockError(ValueError):
    """The records cannot give times (no stand-ins)."""


def judge_clock(records: Sequence[Record]) -> JudgeClock:
    """The judge's times of one worker's calls (``ClockError`` if it made no stand-ins)."""
    stand_ins = [r for r in records if r.phase == "calibrate" and r.done is not None]
    if not stand_ins:
        raise ClockError("the worker made no stand-in calls to calibrate the judge's clock")
    call_ref = statistics.median(r.done - r.go for r in stand_ins)
    prepare_ref = statistics.median(r.ready - r.sent for r in stand_ins)
    counted = [r for r in records if r.phase in COUNTED and r.wall and r.scale == 1.0
               and r.done is not None]
    early = max(0.0, statistics.median(r.ready - r.sent for r in counted) - prepare_ref) \
        if counted else 0.0
    wall = [1e3 * max(0.0, (r.done - r.go) - call_ref + early) for r in counted]
    kept = sum(r.phase != "calibrate" and r.snapped is not None for r in records)
    ref = [ns for ns in map(cycle_cpu_ns, stand_ins) if ns is not None]
    if len(ref) < len(stand_ins):  # the judge could not read the process's CPU time
        return JudgeClock(tuple(wall), call_ref * 1e3, prepare_ref * 1e3, early * 1e3, kept)
    threads = max(1, min(r.threads for r in records))
    ref_ns = statistics.median(ref)
    charged = [max(0.0, (ns or 0) - ref_ns) / threads / 1e6
               for ns in map(cycle_cpu_ns, counted)]
    return JudgeClock(tuple(max(w, c) for w, c in zip(wall, charged, strict=True)),
                      call_ref * 1e3, prepare_ref * 1e3, early * 1e3, kept, ref_ns / 1e6,
                      threads, sum(c > w for w, c in zip(wall, charged, strict=True)))


def cycle_cpu_ns(record: Record) -> int | None:
    """The CPU time every thread of the process but its main thread spent in ``record``'s
    cycle (ns), from the judge's sending the call to the worker's asking for the next;
    None where the judge lacks a mark (the process was gone)."""
    sent, after = record.cpu_sent, record.cpu_next
    if sent is None or after is None:
        return None
    return (after.process_ns - sent.process_ns) - (after.main_ns - sent.main_ns)
