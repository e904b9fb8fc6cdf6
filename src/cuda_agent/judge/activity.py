"""The device's own record of the candidate's calls (CUPTI, through torch's profiler).

Through the gate, ``blocker_post`` waits on the judge's stream for an event recorded after
the call, so every piece of device work the call joined has ended before the post's first
block starts. Device work of the call that ends after that start ran on a stream the call
never joined (hack 14). The device timer sees such work only when it delays the post's blocks
by more than their usual spread; short work (``sin`` over 2M floats, about 10 us, on an H100)
escaped it in about half the calls. The activity record sees every kernel, copy and fill
with its start and end on the device's clock, so it finds the overrun whatever its length.

The record is taken over further calls through the same gate after the timed ones
(``timing.measure``'s ``record``; ``timing.RECORDED_CALLS``), none of them timed: recording
changes how some kernels run. On an H100 a kernel of one full wave at full occupancy (8
blocks of 256 threads per SM, each thread spinning on the SM clock) took 84 us unrecorded and
108 us recorded, in-process, while the same kernel at 4 blocks per SM, a one-thread spin, a
GEMM and ``sin`` kept their times (docs/benchmarks.md). A candidate
cannot tell the recorded calls from the timed ones by their inputs; it could by asking the
profiler, which ``model_new.py`` may not mention (``static_check``), from native code, or
by the pause that starting the recorder makes, about 1 ms once it was started before in the
process (``warm_recorder``, done before the job; docs/judge.md, limits). On by default
(``JudgeConfig.activity_record``). Where the profiler cannot record device activity, the
record says why and the judge falls back on the timer's own check.
"""

from __future__ import annotations

import functools
import time
from bisect import bisect_left, bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

HOLDER = "judge_gate_kernel"
POST = "judge_post_kernel"
OVERRUN_NS = 1_000
"""Work ending this long after the post's first block started overran the call (the
record's timestamps share one device clock; honest calls ended before it in every probe)."""


@dataclass(frozen=True)
class Span:
    """One piece of device work: a kernel, copy or fill, on the device's clock (ns)."""

    name: str
    start_ns: int
    end_ns: int


@dataclass(frozen=True)
class Overruns:
    """What the record shows of the gated calls: how many there were (one holder and one post
    each), and for each, how far (ns) work of the call ran past the post's start (0: none)."""

    calls: int
    late_ns: tuple[int, ...]
    problem: str | None = None

    @property
    def overran(self) -> int:
        return sum(late > OVERRUN_NS for late in self.late_ns)


def overruns(spans: list[Span]) -> Overruns:
    """Pair each holder with its post (in order) and find, among the work that started
    between them, the latest end past the post's start."""
    spans = sorted(spans, key=lambda s: s.start_ns)
    starts = [s.start_ns for s in spans]
    holders = [s for s in spans if HOLDER in s.name]
    posts = [s for s in spans if POST in s.name]
    if len(holders) != len(posts):
        return Overruns(0, (), f"{len(holders)} holders against {len(posts)} posts")
    late: list[int] = []
    for i, (holder, post) in enumerate(zip(holders, posts, strict=True)):
        following = holders[i + 1].start_ns if i + 1 < len(holders) else None
        if not holder.start_ns < post.start_ns or (
                following is not None and following < post.start_ns):
            return Overruns(0, (), f"call {i}: holder and post out of order")
        # the spans starting strictly between the holder's start and the post's
        inside = spans[bisect_right(starts, holder.start_ns):bisect_left(starts, post.start_ns)]
        late.append(max(0, max((s.end_ns - post.start_ns for s in inside), default=0)))
    return Overruns(len(holders), tuple(late))


class ActivityRecord:
    """Record device activity while open (a context manager); ``summary()`` after.

    ``enabled`` False (CPU, no gate) records nothing and summarises as not recorded."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self._profile: Any = None
        self.error: str | None = None
        self.spans: list[Span] = []
        self.seconds = 0.0  # stopping the record and reading it
        self.start_seconds = 0.0  # starting it

    def __enter__(self) -> ActivityRecord:
        if not self.enabled:
            return self
        start = time.perf_counter()
        try:
            from torch.profiler import ProfilerActivity, profile

            self._profile = profile(activities=[ProfilerActivity.CUDA])
            self._profile.__enter__()
        except Exception as exc:  # no CUPTI here: the timer's own check stands alone
            self._profile, self.error = None, f"{type(exc).__name__}: {exc}"[:300]
        self.start_seconds = time.perf_counter() - start
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._profile is None:
            return
        start = time.perf_counter()
        try:
            self._profile.__exit__(None, None, None)
            events = self._profile.profiler.kineto_results.events()
            self.spans = [Span(e.name(), int(e.start_ns()), int(e.end_ns())) for e in events
                          if e.device_type().name == "CUDA" and e.end_ns() >= e.start_ns()]
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {exc}"[:300]
        self.seconds = time.perf_counter() - start

    def summary(self, calls: int) -> dict[str, Any]:
        """Timing details: whether the record was taken, how many calls it holds against the
        ``calls`` made through the gate while it was open, and how many overran (the largest
        overrun, us)."""
        if not self.enabled:
            return {"activity": False}
        if self._profile is None or self.error:
            return {"activity": False, "activity_error": self.error}
        if not self.spans:  # the profiler ran but saw no device (CUPTI not working here)
            return {"activity": False,
                    "activity_error": "the profiler recorded no device activity"}
        found = overruns(self.spans)
        problem = found.problem
        if problem is None and found.calls != calls:
            problem = f"{found.calls} calls recorded, {calls} made"
        return {"activity": True, "activity_calls": found.calls,
                "activity_read_seconds": self.seconds,
                "activity_start_seconds": self.start_seconds,
                "activity_problem": problem, "overran": found.overran,
                "overrun_us_max": max(found.late_ns, default=0) / 1e3}


@functools.cache
def warm_recorder() -> None:
    """Start and stop the recorder once per process, before any candidate code runs: its
    first start in a process starts threads of its own (3 on an H100; later starts none) and
    took seconds in a probe's process (later starts 1 ms), either of which would tell a
    candidate that the record had begun. Nothing is raised where it cannot record."""
    with ActivityRecord(enabled=True):
        pass


class WatchedRecord:
    """A record as a worker opens it among watched threads: ``check`` first (no thread of the
    candidate's may hide among the recorder's), then ``adopt`` once the recorder has started
    its threads and again once it has stopped (when nothing went wrong meanwhile: the calls
    inside are watched one by one)."""

    def __init__(self, record: ActivityRecord, check: Callable[[], None],
                 adopt: Callable[[], None]):
        self.record, self.check, self.adopt = record, check, adopt

    def __enter__(self) -> ActivityRecord:
        self.check()
        self.record.__enter__()
        self.adopt()
        return self.record

    def __exit__(self, kind: Any, *exc: Any) -> None:
        self.record.__exit__(kind, *exc)
        if kind is None:
            self.adopt()
