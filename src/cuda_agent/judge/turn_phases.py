"""What a worker's calls need of its judge's GPU turn (``gpu_turn``), phase by phase.

Exclusive: the phases whose measurements go into a verdict or a baseline (``MEASURED``:
the stand-ins, and everything from the end of the warm-up, where the device timer
calibrates itself, to the end of the tail). Shared: the rest of the worker's GPU work (its
set-up, a candidate's loading between its stand-ins and its warm-up, the warm-up, what
follows the tail). The judge's call driver (``driver.CallDriver``) settles each phase's
hold before the worker hears of the call or of the phase's end, so a worker that skips a
phase still times alone.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from cuda_agent.judge.gpu_turn import EXCLUSIVE, SHARED, GpuTurn, clock

MEASURED = ("calibrate", "timed", "record", "tail")
"""The phases whose calls are measured: the stand-ins (their median is the protocol's cost
on the judge's clock) and the timed calls with what follows them to the end of the tail."""


class PhaseTurns:
    """One worker's phases' holds of ``turn``: the driver calls ``before`` ahead of each
    call and ``ended`` as it ends a phase.

    A candidate's hold is taken before its job (``candidate_job``, exclusive, with the
    intent to step up again) and kept without a break until its process is dead; a trusted
    worker (reference, baselines; ``trusted_job``) has its own work synchronised when it
    asks for its first stand-in, so there the judge lets its shared hold go and waits for an
    exclusive one, which it keeps to the job's end (the reference measures the memory
    bandwidth after its tail). After ``stop`` nothing changes."""

    def __init__(self, turn: GpuTurn, trusted: bool):
        self.turn, self.trusted = turn, trusted
        self._span: float | None = None
        self._stopped = False
        self._mutex = threading.Lock()

    def __enter__(self) -> PhaseTurns:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def before(self, phase: str) -> None:
        """Ahead of a call of ``phase``."""
        with self._mutex:
            if phase in MEASURED:
                self._level(EXCLUSIVE)
                self._begin()
            elif phase == "warmup":
                self._end()
                self._level(SHARED)

    def ended(self, phase: str) -> None:
        """As the judge ends ``phase``, before it says so to the worker."""
        with self._mutex:
            if phase == "calibrate":
                self._end()
                self._level(SHARED)
            elif phase == "warmup":
                self._level(EXCLUSIVE)
                self._begin()
            elif phase == "tail":
                self._end()
                if not self.trusted:
                    self._level(SHARED)

    def stop(self) -> None:
        """The worker's run is over: later calls change nothing."""
        with self._mutex:
            self._end()
            self._stopped = True

    def _level(self, level: str) -> None:
        turn = self.turn
        if self._stopped or turn.path is None or turn.level == level:
            return
        if level == SHARED:
            turn.downgrade()
        elif turn.intent:
            turn.upgrade()
        elif self.trusted:  # idle, its work synchronised: nothing of it on the GPU now
            turn.release()
            turn.exclusive(upgradable=True)
        else:
            raise RuntimeError("a candidate's calls asked for the GPU to themselves after "
                               "their timed phases ended")

    def _begin(self) -> None:
        if self._span is None and not self._stopped:
            self._span = clock()

    def _end(self) -> None:
        if self._span is not None:
            self.turn.log("timing", self._span, clock())
            self._span = None


@contextlib.contextmanager
def trusted_job(turn: GpuTurn) -> Iterator[PhaseTurns]:
    """The hold of a trusted worker's timed job (reference, baselines), its phases' turns
    given to its driver: shared from the job on, exclusive from its first stand-in; let go
    after the block (the worker idle or ended)."""
    with turn.hold(SHARED), PhaseTurns(turn, trusted=True) as turns:
        yield turns


@contextlib.contextmanager
def candidate_job(turn: GpuTurn, timed: bool) -> Iterator[PhaseTurns | None]:
    """The hold of a candidate's process, from before its job until after the block (which
    must end the process): a timed one's phases' turns for its driver, exclusive from the
    start; an untimed one's shared throughout (None)."""
    with turn.hold(EXCLUSIVE if timed else SHARED, upgradable=timed), \
            PhaseTurns(turn, trusted=False) as turns:
        yield turns if timed else None
