"""The judge's end of the call protocol (``calls``): it hands out every call, times it with
its own clock, and decides after each call has returned whether to keep it.

Which calls are kept is a reservoir sample (``Reservoir``): after call i the judge keeps it
with probability k/i, in place of a kept call chosen at random, so the k calls finally
checked are a uniform sample of the whole run, whatever its length, and no position is
safer than another. Only the counted calls (``COUNTED``: those the times come from) are
offered: the warm-up's length is the judge's to decide, but its calls are not timed, so a
sample drawn partly from them would let a candidate compute in the warm-up and skip the
work in the calls that count. Wall calls (timed by the judge's clock) and the others
(timed by the device timer on CUDA) each have a reservoir of their own: the worker is told
which kind a call is (it must synchronise differently), so neither kind may go unchecked.

A kept call's outputs and inputs are copied into the pack by the worker
and read back by the judge at once (``PackReader``): a later write by the candidate cannot
change them, and outputs that were not finished when the worker said ``done`` are caught
(the read waits for nothing; what it finds is compared with the reference later). Scaled
calls (inputs times ``scales``) go out at random positions and are always kept.

Everything the judge measures is in ``records``; ``clock.JudgeClock`` turns them into times.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from cuda_agent.judge.calls import PHASES, Closed, Lines, ProtocolError
from cuda_agent.judge.cpu_clock import CpuMark, ProcessCpu, open_process
from cuda_agent.judge.secret import Keyed
from cuda_agent.judge.turn_phases import PhaseTurns

_clock = time.perf_counter
SEED_BITS = 62
MAX_WARMUP, MAX_TIMED, MAX_RECORD = 200, 20_000, 64
"""Calls a phase ends at whatever the worker asks (it owes the judge nothing more)."""
CALIBRATE_FLOOR = 5
"""Stand-ins made at least: their median is the protocol's cost."""
COUNTED = ("timed", "record", "tail", "check")
"""Phases whose calls are kept and timed (the warm-up's and the stand-ins' are neither)."""


@dataclass
class Record:
    """One call as the judge saw it; times are the judge's ``perf_counter`` seconds."""

    index: int
    phase: str
    seed: int
    scale: float
    wall: bool
    sent: float
    ready: float | None = None
    go: float | None = None
    done: float | None = None
    keep_sent: float | None = None
    snapped: float | None = None
    cpu_sent: CpuMark | None = None
    cpu_next: CpuMark | None = None
    """The worker's CPU time (``cpu_clock``) when the judge sent the call and when it
    answered the worker's next ``need``: the call's cycle."""
    threads: int = 1
    """The threads the worker's calls may keep busy at once (``cpu_clock.thread_budget``)."""


@dataclass(frozen=True)
class Snapshot:
    """A kept call's outputs and inputs, as the judge read them when the worker said so."""

    index: int
    seed: int
    scale: float
    outputs: list[torch.Tensor]
    inputs: list[torch.Tensor]


@dataclass
class DriverPlan:
    """What the judge does with one worker's calls."""

    keep: int = 0
    """Unscaled calls to keep (the reservoir's size; 0: keep none)."""
    scales: tuple[float, ...] = ()
    """Calls at these input scales, each sent once at a random position and kept."""
    wall_share: float = 1.0
    """Share of the calls that are ``wall`` calls (CPU: all of them); ``record`` calls are
    never wall calls (the activity record pairs gated calls)."""
    calibrate: int = 0
    """Stand-in calls before any candidate code (``phase calibrate``), to measure what the
    protocol itself costs; every third one is kept (the worker packs stand-ins)."""
    calibrate_s: float = math.inf
    """...fewer once at least ``CALIBRATE_FLOOR`` took this long (``spent``): stand-ins run
    before any candidate code, so their number is the judge's alone either way."""
    expected_calls: int = 60
    """About how many calls the worker makes: the scaled calls are spread over so many."""
    warmup: int = 0
    warmup_s: float = 0.0
    """The warm-up ends once at least this many calls and seconds have gone (the judge's
    count and clock, whatever the worker asks)..."""
    warmup_budget_s: float = math.inf
    """...or, from its first call on, once its calls took this long (``spent``) and
    ``warmup_s`` has gone: a call that long is warm after the first."""
    min_runs: int = 0
    """The timed phase ends when the worker asks, from this many calls on..."""
    floor_runs: int = 0
    budget_s: float = math.inf
    """...or from ``floor_runs`` calls on once the timed calls took ``budget_s`` (``spent``):
    a worker can end its timing before ``min_runs`` only by calls that took the budget."""
    record: bool = False
    """Whether the worker may make ``record`` calls (the activity record, on CUDA)."""
    timed: bool = True
    """Whether the job times its calls: a timed job's calls go through ``warmup``,
    ``timed`` (``record``) and ``tail``, an untimed one's through ``check`` alone; a worker
    that asks for the other kind's phases is refused (served as ``check`` calls, a timed
    job's calls would escape the judge's clock)."""
    rng: random.Random = field(default_factory=Keyed)
    """Never Python's own generator in a judgement: its outputs give away its state."""


def spent(records: list[Record]) -> float:
    """The calls' own time by the judge's clock (s): from sending each call to its ``done``.
    The time between calls is the worker's and counts for nothing, so a worker that idles
    there spends none of a budget; and a worker's own measure of a call, from receiving it
    to saying ``done``, is never more than the judge's."""
    return sum(r.done - r.sent for r in records if r.done is not None)


class Reservoir:
    """Keep call i (1-based, counting the calls offered) with probability k/i, evicting a
    kept one at random: the survivors are a uniform sample of every call offered."""

    def __init__(self, size: int, rng: random.Random):
        self.size, self.rng = size, rng
        self.kept: list[int] = []
        self.offered = 0

    @property
    def unfilled(self) -> int:
        return max(0, self.size - len(self.kept))

    def offer(self, index: int) -> int | None:
        """Whether to keep call ``index``; returns the evicted index (-1 for none) if kept,
        None if not."""
        self.offered += 1
        if self.size <= 0:
            return None
        if len(self.kept) < self.size:
            self.kept.append(index)
            return -1
        if self.rng.random() * self.offered >= self.size:
            return None
        slot = self.rng.randrange(self.size)
        evicted, self.kept[slot] = self.kept[slot], index
        return evicted


class CallDriver:
    """Serves one worker's calls on a thread of its own, from ``start`` until the worker
    closes its end; ``error`` says how the worker broke the protocol, if it did."""

    def __init__(self, lines: Lines, plan: DriverPlan,
                 read_kept: Callable[[dict[str, Any]], tuple[list[Any], list[Any]]] | None,
                 at_counted: Callable[[], None] | None = None,
                 pid_of: Callable[[], int | None] | None = None,
                 turns: PhaseTurns | None = None,
                 on_error: Callable[[], None] | None = None):
        self.lines, self.plan, self.read_kept = lines, plan, read_kept
        self.on_error = on_error
        """Called once the worker broke the protocol (the judge ends it then: a process that
        spins on after the judge hung up would otherwise hold the judgement until its
        timeout)."""
        self.turns = turns
        """What each phase needs of the judge's GPU turn (``turn_phases.PhaseTurns``), settled
        before the worker hears of a call or of a phase's end."""
        self._pid_of = pid_of
        """The worker's interpreter, looked up at its first message (before any candidate
        code): the process whose CPU time the judge reads around every call."""
        self.cpu: ProcessCpu | None = None
        self.at_counted = at_counted
        """Called once, when the first counted call is done (the worker forbids new native
        code before it returns): what the judge looks at in the process from then on."""
        self.records: list[Record] = []
        self.snapshots: dict[int, Snapshot] = {}
        self.reservoirs = self._reservoirs()
        self.error: str | None = None
        self.finished = False
        self._phase = 0
        self._ended: set[str] = set()
        self._scaled = self._place_scaled()
        self._thread = threading.Thread(target=self._serve, daemon=True, name="judge-calls")

    def _reservoirs(self) -> dict[bool, Reservoir]:
        """One reservoir per kind of call (wall or not), their sizes summing to ``keep``.
        A single kept call is drawn from both kinds alike: a reservoir of none would be
        learnt from the answers (its kind never kept) and left unchecked."""
        keep, rng = self.plan.keep, self.plan.rng
        if self.plan.wall_share >= 1 or keep <= 1:
            both = Reservoir(keep, rng)
            return {True: both, False: both}
        wall = (keep + 1) // 2
        return {True: Reservoir(wall, rng), False: Reservoir(keep - wall, rng)}

    def _place_scaled(self) -> dict[int, float]:
        """Counted-call numbers (from 2: never the first call) at which the scaled calls
        go out; any not reached by the end go out in the tail."""
        span = max(len(self.plan.scales) + 1, self.plan.expected_calls)
        spots = self.plan.rng.sample(range(2, span + 2), len(self.plan.scales))
        return dict(zip(spots, self.plan.scales, strict=True))

    def start(self) -> CallDriver:
        self._thread.start()
        return self

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)

    def kept(self) -> list[Snapshot]:
        """The kept calls the reference must check, in call order: the reservoir's and the
        scaled ones."""
        wanted = {*self.reservoirs[True].kept, *self.reservoirs[False].kept} | {
            r.index for r in self.records if r.scale != 1.0 and r.snapped is not None}
        return [self.snapshots[i] for i in sorted(wanted) if i in self.snapshots]

    def owed(self) -> int:
        """Calls the judge still has to send before it ends the run: scaled calls not sent
        and reservoir places not filled."""
        distinct = {id(r): r for r in self.reservoirs.values()}  # one may serve both kinds
        return len(self._scaled) + sum(r.unfilled for r in distinct.values())

    def _unfilled(self, wall: bool) -> int:
        return self.reservoirs[wall].unfilled

    def _serve(self) -> None:
        try:
            while True:
                message = self.lines.receive()
                if message["t"] != "need":
                    raise ProtocolError(f"expected need, got {message['t']!r}")
                if self._pid_of is not None:  # its first message: no candidate code yet
                    pid_of, self._pid_of = self._pid_of, None
                    self.cpu = open_process(pid_of())
                call = self._next(str(message.get("phase")), bool(message.get("stop")))
                asked = self._cpu()
                if self.records and self.records[-1].cpu_next is None:
                    self.records[-1].cpu_next = asked  # its cycle ends as the worker asks on
                if call is None:
                    self.lines.send({"t": "end"})
                    if message.get("phase") in ("tail", "check"):
                        self.finished = True
                    continue
                call.cpu_sent = asked
                self._run(call)
        except ProtocolError as exc:
            if not isinstance(exc, Closed):  # a worker that ended says why itself
                self.error = str(exc)
        except Exception as exc:  # a bug here must fail the judgement, not hang it
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            if self.error is not None and self.on_error is not None:
                self.on_error()
            self.lines.sock.close()
            if self.cpu is not None:
                self.cpu.close()

    def _next(self, phase: str, stop: bool) -> Record | None:
        """The next call of ``phase``, or None to end it. The judge ends the warm-up by its
        own count and clock alone (the worker's ``stop`` is not heard: a worker that could
        stretch the warm-up would dilute the counted calls), the timed phase no sooner than
        ``min_runs``, or ``floor_runs`` once the budget is spent (by the judge's clock), and
        no phase may come back once a later one began. Scaled calls are
        wall calls, and never ``record`` calls (the activity record pairs gated calls); a
        ``tail`` or ``check`` call is of a kind whose reservoir is not yet full."""
        plan, rng = self.plan, self.plan.rng
        self._advance(phase)
        made = [r for r in self.records if r.phase == phase]
        if phase == "calibrate":
            ends = len(made) >= plan.calibrate or (
                len(made) >= CALIBRATE_FLOOR and spent(made) >= plan.calibrate_s)
        elif phase in ("tail", "check"):
            ends = self.owed() == 0
        elif phase == "warmup":
            began = made[0].sent if made else _clock()
            warm = len(made) >= plan.warmup or (made and spent(made) >= plan.warmup_budget_s)
            ends = (warm and _clock() - began >= plan.warmup_s
                    ) or len(made) >= max(10 * plan.warmup, MAX_WARMUP)
        elif phase == "timed":
            may = len(made) >= plan.min_runs or (
                len(made) >= plan.floor_runs and spent(made) >= plan.budget_s)
            ends = (stop and may) or len(made) >= MAX_TIMED
        else:  # record
            ends = stop or len(made) >= MAX_RECORD
        if ends:
            self._ended.add(phase)
            if self.turns is not None:
                self.turns.ended(phase)
            return None
        if self.turns is not None:
            self.turns.before(phase)
        scale = None
        if phase in COUNTED and phase != "record" and self._scaled:
            number = sum(r.phase in COUNTED for r in self.records) + 1
            scale = self._scaled.pop(number, None)
            if scale is None and phase in ("tail", "check"):
                scale = self._scaled.pop(min(self._scaled))
        if phase == "calibrate" or scale is not None:
            wall = True
        elif phase in ("tail", "check") and self._unfilled(True) != self._unfilled(False):
            wall = self._unfilled(True) > 0
        else:
            wall = phase != "record" and rng.random() < plan.wall_share
        return Record(len(self.records), phase, rng.getrandbits(SEED_BITS),
                      1.0 if scale is None else scale, wall, _clock())

    def _advance(self, phase: str) -> None:
        """Phases go in order (``calls.PHASES``, ``check`` alone after ``calibrate``); one
        the judge has ended cannot be asked for again."""
        untimed = ("calibrate", "check")
        if phase not in PHASES or (phase == "record" and not self.plan.record) or (
                (phase in untimed) != (phase == "calibrate" or not self.plan.timed)):
            raise ProtocolError(f"a call of phase {phase!r}, which this worker has not")
        if phase in self._ended:
            raise ProtocolError(f"a call of phase {phase!r} after the judge ended it")
        if phase in ("record", "tail") and self.plan.timed and "timed" not in self._ended:
            raise ProtocolError(f"a call of phase {phase!r} before the judge ended the "
                                "timed calls")  # else a worker could skip them
        order = PHASES.index(phase)
        if order < self._phase:
            raise ProtocolError(f"a call of phase {phase!r} after a later phase")
        self._phase = order

    def _cpu(self) -> CpuMark | None:
        return self.cpu.read() if self.cpu is not None else None

    def _run(self, record: Record) -> None:
        record.threads = self.cpu.budget if self.cpu is not None else 1
        self.records.append(record)
        record.sent = _clock()
        self.lines.send({"t": "call", "s": record.seed, "x": record.scale, "w": record.wall})
        self._expect("ready")
        record.ready = _clock()
        record.go = _clock()
        self.lines.send({"t": "go"})
        message = self._expect("done")
        record.done = _clock()
        if record.phase in COUNTED and self.at_counted is not None:
            at_counted, self.at_counted = self.at_counted, None
            at_counted()
        if self._keep(record):  # read before the worker can learn it was kept
            record.keep_sent = record.done
            outputs, inputs = self.read_kept(message)
            record.snapped = _clock()
            if record.phase != "calibrate":  # a stand-in's pack only times the reading
                self.snapshots[record.index] = Snapshot(record.index, record.seed,
                                                        record.scale, outputs, inputs)
        self.lines.send({"t": "keep" if record.snapped is not None else "next"})

    def _keep(self, record: Record) -> bool:
        if self.read_kept is None:
            return False
        if record.phase == "calibrate":
            return record.index % 3 == 2
        if record.scale != 1.0:
            return True
        if record.phase not in COUNTED:
            return False
        evicted = self.reservoirs[record.wall].offer(record.index)
        if evicted is None:
            return False
        if evicted >= 0:
            self.snapshots.pop(evicted, None)
        return True

    def _expect(self, kind: str) -> dict[str, Any]:
        message = self.lines.receive()
        if message["t"] != kind:
            raise ProtocolError(f"expected {kind}, got {message['t']!r}")
        return message
