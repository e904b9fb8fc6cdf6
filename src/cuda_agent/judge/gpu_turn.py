"""Judges that share a GPU take turns on it: a reader-writer lock across processes.

A pool may run several judges per GPU (``PoolConfig.jobs_per_gpu``). A judge holds the
GPU's turn *exclusive* through every phase whose measurements go into a verdict or a
baseline (a worker's stand-ins, and its calls from the end of its warm-up to the end of its
tail: ``turn_phases``), and *shared* through the rest of its GPU work (the reference's jobs,
staging a worker, a candidate's set-up, loading and warm-up, a worker's exit, the
comparisons). So no timed phase of one judge overlaps any GPU work of another, while the
untimed GPU work of several judges overlaps; the build, the workers' start-up and the
static check hold nothing.

``flock`` on three files per GPU (under the cuda-agent home); the kernel lets a holder's
locks go when it dies:

- ``PATH``, the turn: ``LOCK_SH`` for each shared holder, ``LOCK_EX`` for the exclusive one.
- ``PATH.gate``: every acquisition of the turn passes it. A shared holder takes it and lets
  it go once in; an exclusive holder keeps it from before it waits until it lets the turn go
  or steps down to shared. So once an exclusive holder waits, no new shared holder comes
  in: a stream of shared holders cannot starve it. Converting a ``flock`` from one kind to
  the other is not atomic (the old lock goes first); a judge converts only while it holds
  the gate, so no one comes in between.
- ``PATH.intent``: every exclusive acquisition passes it. A candidate's process may use the
  GPU from its first line of code until it is dead, so its judge holds the turn without a
  break from the stand-ins to the process's exit, stepping down to shared for the loading
  and warm-up and back up for the timed calls. Two judges each holding the turn shared and
  waiting to step up would wait for each other forever; the judge that will step up keeps
  ``intent`` until it has, so no one else can be waiting to.

``CUDA_AGENT_GPU_TURN_LOG=FILE`` appends every hold (and every timed span of a worker's
calls, ``turn_phases``) to FILE as a JSON line: ``{"lock", "turn", "pid", "kind", "start",
"end"}``, times from the system-wide monotonic clock; tests and the pool benchmark read it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

SHARED, EXCLUSIVE = "shared", "exclusive"
LOG_ENV = "CUDA_AGENT_GPU_TURN_LOG"
clock = time.monotonic


class GpuTurn:
    """One judge's hold on the turn at ``path`` (files created if missing): none, shared or
    exclusive. ``None``: no lock, every method does nothing. Thread-safe: a transition runs
    whole (waits included) before the next one starts."""

    def __init__(self, path: str | Path | None):
        self.path = Path(path) if path else None
        self.level: str | None = None
        self.intent = False
        self._gate = False
        self._fds: dict[str, int] = {}
        self._mutex = threading.Lock()
        self._since = 0.0
        self.waited_s = 0.0
        self.held_s = {SHARED: 0.0, EXCLUSIVE: 0.0}
        self.name = uuid.uuid4().hex[:12]
        self._log = os.environ.get(LOG_ENV) if self.path is not None else None

    # --- transitions ------------------------------------------------------------------------

    def shared(self, wait: bool = True) -> bool:
        """Take the turn shared (from none); False if ``wait`` is off and it is not free."""
        with self._mutex:
            if self.path is None:
                return True
            self._require(None)
            if not self._flock(".gate", fcntl.LOCK_EX, wait):
                return False
            try:
                if not self._flock("", fcntl.LOCK_SH, wait):
                    return False
            finally:
                self._unlock(".gate")
            self._enter(SHARED)
            return True

    def exclusive(self, upgradable: bool = False, wait: bool = True) -> bool:
        """Take the turn exclusive (from none); with ``upgradable`` keep ``intent``, so the
        hold may step down (``downgrade``) and back up (``upgrade``) without a break."""
        with self._mutex:
            if self.path is None:
                return True
            self._require(None)
            taken: list[str] = []
            for suffix in (".intent", ".gate", ""):
                if not self._flock(suffix, fcntl.LOCK_EX, wait):
                    for held in reversed(taken):
                        self._unlock(held)
                    return False
                taken.append(suffix)
            self._gate = True
            if upgradable:
                self.intent = True
            else:
                self._unlock(".intent")
            self._enter(EXCLUSIVE)
            return True

    def downgrade(self) -> None:
        """Exclusive to shared, with no break; never waits."""
        with self._mutex:
            if self.path is None:
                return
            self._require(EXCLUSIVE)
            self._switch(SHARED)
            fcntl.flock(self._fd(""), fcntl.LOCK_SH)  # under the gate: no one else comes in
            self._unlock(".gate")
            self._gate = False

    def upgrade(self) -> None:
        """Shared to exclusive, with no break (a hold taken ``upgradable``): waits for the
        other shared holders to let go."""
        with self._mutex:
            if self.path is None:
                return
            self._require(SHARED)
            if not self.intent:
                raise RuntimeError("the GPU's turn can step up only from an upgradable hold")
            self._flock(".gate", fcntl.LOCK_EX)
            self._gate = True
            self._flock("", fcntl.LOCK_EX)  # under the gate: no one else comes in
            self._unlock(".intent")
            self.intent = False
            self._switch(EXCLUSIVE)

    def release(self) -> None:
        """Let the turn go, whatever is held."""
        with self._mutex:
            if self.path is None or (self.level is None and not self.intent):
                return
            if self.level is not None:
                self._record(self.level, self._since, clock())
                self._unlock("")
                self.level = None
            if self._gate:
                self._unlock(".gate")
                self._gate = False
            if self.intent:
                self._unlock(".intent")
                self.intent = False

    @contextlib.contextmanager
    def hold(self, level: str, upgradable: bool = False) -> Iterator[GpuTurn]:
        """Hold the turn at ``level`` (from none) for the block; let it go after, whatever
        it was stepped to meanwhile."""
        if level == SHARED:
            self.shared()
        else:
            self.exclusive(upgradable)
        try:
            yield self
        finally:
            self.release()

    @contextlib.contextmanager
    def first_to_measure(self) -> Iterator[None]:
        """Exclusive among the judges of this GPU (``PATH.baselines``), waits counted: a
        judge measures a new task's baselines while it holds this, so the others, who look
        for them again once they have it, find them measured."""
        if self.path is None:
            yield
            return
        self._flock(".baselines", fcntl.LOCK_EX)
        try:
            yield
        finally:
            self._unlock(".baselines")

    def close(self) -> None:
        self.release()
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    # --- accounts ---------------------------------------------------------------------------

    def totals(self) -> tuple[float, float, float]:
        """Seconds waited for the turn, held shared and held exclusive, so far."""
        held = dict(self.held_s)
        if self.level is not None:
            held[self.level] += clock() - self._since
        return self.waited_s, held[SHARED], held[EXCLUSIVE]

    def log(self, kind: str, start: float, end: float) -> None:
        """Append a span to the log (``LOG_ENV``), if one is kept."""
        if self._log is None:
            return
        line = json.dumps({"lock": str(self.path), "turn": self.name, "pid": os.getpid(),
                           "kind": kind, "start": start, "end": end}) + "\n"
        fd = os.open(self._log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, line.encode())  # one write of an appended line: lines never mix
        finally:
            os.close(fd)

    # --- below ------------------------------------------------------------------------------

    def _require(self, level: str | None) -> None:
        if self.level != level:
            raise RuntimeError(f"the GPU's turn is held {self.level or 'not at all'}, "
                               f"expected {level or 'not at all'}")

    def _fd(self, suffix: str) -> int:
        if suffix not in self._fds:
            path = self.path.with_name(self.path.name + suffix)
            path.parent.mkdir(parents=True, exist_ok=True)
            self._fds[suffix] = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        return self._fds[suffix]

    def _flock(self, suffix: str, how: int, wait: bool = True) -> bool:
        """Lock ``PATH + suffix`` (``how``), the wait counted; False if ``wait`` is off and
        it is held elsewhere."""
        start = clock()
        try:
            fcntl.flock(self._fd(suffix), how | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            return False
        finally:
            self.waited_s += clock() - start
        return True

    def _unlock(self, suffix: str) -> None:
        fcntl.flock(self._fd(suffix), fcntl.LOCK_UN)

    def _enter(self, level: str) -> None:
        self.level, self._since = level, clock()

    def _switch(self, level: str) -> None:
        now = clock()
        self._record(self.level, self._since, now)
        self.level, self._since = level, now

    def _record(self, level: str, start: float, end: float) -> None:
        self.held_s[level] += end - start
        self.log(level, start, end)

