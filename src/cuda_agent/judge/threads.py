"""Native threads in the candidate's process: none that candidate code starts may work
outside its calls.

Work handed to a thread finishes outside the timed call, where no clock sees it. This module
watches the operating system's view, which sees Python threads (named as Python names them)
and threads started from C++ or CUDA host code alike. The process's threads are listed
(``/proc/<pid>/task``) once the worker is settled, before any candidate code runs; a thread
that appears later is the candidate's, and it is work outside the calls only if it runs
there: its CPU time (``schedstat``, in ns; ``stat``'s utime + stime, in clock ticks, where
the kernel keeps no schedstat) may advance inside calls only. An idle thread is no work: an
OpenMP team larger than PyTorch's pool leaves its extra threads parked in libgomp's pool.

After a call returns (``problem``) the candidate's threads must settle: none running, each
within ``SPIN_NS`` of CPU time since the call returned (libgomp spins up to 300,000 pauses
before a parked thread sleeps: 7-13 ms of CPU per thread on a 16-core host, about none
where the team outnumbers the cores). A thread that keeps running is refused with its name.
From there until the next call starts (``before_call``, called right before each call) a
thread's CPU time may advance by ``TOLERANCE_NS`` at most: one that wakes and works between
calls is refused too. What a thread does while settling is timed where the settling runs
inside the timed call (``harness.call`` runs ``problem`` there); elsewhere up to
``SPIN_NS`` of CPU per thread and call would escape the clock.

A thread that has dropped the process's memory (exiting: a C++ ``join`` returns then,
microseconds before the thread leaves ``/proc``) runs no more code and is not counted.
``snapshot`` and ``worked`` read any process: the judge can read its candidate's threads by
their host pid, from outside.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

TOLERANCE_NS = 100_000
"""CPU time a parked thread may gain between calls: a spurious futex wake or a signal
handled costs microseconds; a parked libgomp thread gained none over 0.5 s here."""
SPIN_NS = 50_000_000
"""CPU time a candidate's thread may spend after a call returns before it sleeps."""
SETTLE_S = 10.0
"""Wall time the settling may take at most: only a thread that is runnable but starved of
CPU for this long (neither sleeping nor spending its allowance) is refused by it."""
POLL_S = (50e-6, 5e-3)
"""The first and the longest pause between two looks at settling threads."""
RUNNING = frozenset("R")


@dataclass(frozen=True)
class Task:
    """One thread as the kernel reports it: CPU time so far (ns) and state (``R`` running
    or runnable, ``S`` sleeping, ``D`` waiting on I/O, ...)."""

    cpu_ns: int
    state: str


def _tasks(pid: int | str) -> Path:
    return Path(f"/proc/{pid}/task")


def native_threads(pid: int | str = "self") -> set[str]:
    """The thread ids of process ``pid`` (empty where ``/proc`` is not available)."""
    try:
        return set(os.listdir(_tasks(pid)))
    except OSError:
        return set()


def _stat_fields(pid: int | str, tid: str) -> list[str] | None:
    """``/proc/<pid>/task/<tid>/stat`` after the command name (field 3 on), or None."""
    try:
        stat = (_tasks(pid) / tid / "stat").read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2:].split()


TICK_NS = 1_000_000_000 // (os.sysconf("SC_CLK_TCK") or 100)


def read_task(tid: str, pid: int | str = "self") -> Task | None:
    """Thread ``tid``'s CPU time and state, or None where it is gone or exiting."""
    fields = _stat_fields(pid, tid)
    if fields is None or len(fields) < 21 or fields[20] == "0":  # vsize 0: exiting
        return None
    try:
        cpu_ns = int((_tasks(pid) / tid / "schedstat").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        cpu_ns = (int(fields[11]) + int(fields[12])) * TICK_NS  # utime + stime, in ticks
    return Task(cpu_ns, fields[0])


def snapshot(pid: int | str = "self", tids: Iterable[str] | None = None) -> dict[str, Task]:
    """``{tid: Task}`` of process ``pid``'s threads (those of ``tids`` only, if given) that
    still run user code."""
    found = {tid: read_task(tid, pid) for tid in (native_threads(pid) if tids is None
                                                  else tids)}
    return {tid: task for tid, task in found.items() if task is not None}


def worked(before: dict[str, Task], after: dict[str, Task],
           tolerance_ns: int = TOLERANCE_NS) -> list[str]:
    """The threads of ``after`` whose CPU time advanced by more than ``tolerance_ns`` since
    ``before`` (a thread new in ``after`` from zero), in thread-id order."""
    return sorted((tid for tid, task in after.items()
                   if task.cpu_ns - (before[tid].cpu_ns if tid in before else 0) > tolerance_ns),
                  key=int)


def runs_user_code(tid: str, pid: int | str = "self") -> bool:
    """Whether thread ``tid`` still has the process's memory: one that is exiting has
    dropped it (its ``stat`` shows a virtual size of 0) and can run no more code of the
    candidate's. ``join`` returns about then, some microseconds before the thread's task
    leaves ``/proc``."""
    fields = _stat_fields(pid, tid)
    if fields is None:
        return False  # gone
    try:
        return int(fields[20]) != 0  # field 23 of stat, vsize; the first two precede these
    except (IndexError, ValueError):
        return True


def thread_name(tid: str, pid: int | str = "self") -> str:
    """A Python thread's own name (this process), else the operating system's (``comm``)."""
    if pid == "self" or pid == os.getpid():
        for thread in threading.enumerate():
            if str(thread.native_id) == tid:
                return thread.name
    try:
        return (_tasks(pid) / tid / "comm").read_text().strip() or tid
    except OSError:
        return tid


class ThreadWatch:
    """The threads present before candidate code ran, and the checks against them."""

    def __init__(self, known: set[str], pool: int, pid: int | str = "self"):
        self.known = known
        self.pool = pool
        self.pid = pid
        self.settled: dict[str, Task] = {}
        """The candidate's threads where they last settled (after the last call)."""
        self.spun_ns = 0
        """CPU time the candidate's threads spent settling after calls, in all."""

    @classmethod
    def settle(cls, device: str) -> ThreadWatch:
        """Start what lazily starts threads (the CUDA context, the OpenMP pool), then list."""
        if device.startswith("cuda"):
            torch.zeros(1, device=device).add_(1)
            torch.cuda.synchronize()
        # a parallel fill makes the OpenMP pool exist (at::parallel_for past its grain)
        torch.ones(1 << 20).add_(1)
        return cls(native_threads(), torch.get_num_threads())

    def adopt(self) -> None:
        """Count the threads alive now as the judge's: call it only right after judge code
        that starts threads of its own (the activity record), with no candidate code run
        since the last check."""
        self.known |= native_threads(self.pid)
        self.settled = {t: task for t, task in self.settled.items() if t not in self.known}

    def _theirs(self) -> dict[str, Task]:
        return snapshot(self.pid, native_threads(self.pid) - self.known)

    def started(self) -> list[str]:
        """Names of the candidate's threads alive now (not there when the watch settled)."""
        return [thread_name(tid, self.pid) for tid in sorted(self._theirs(), key=int)]

    def before_call(self) -> str | None:
        """A message naming the candidate's threads that worked since they last settled
        (a thread started since, from its start), or None; call it right before each call."""
        now = self._theirs()
        moved = worked(self.settled, now)
        self.settled = now
        return self._refusal(moved, "worked between calls, after they had settled")

    def problem(self, when: str) -> str | None:
        """After a call (``when`` says which point): a message naming the candidate's
        threads that do not settle (still running after ``SETTLE_S``, or past ``SPIN_NS``
        of CPU since the call returned), or None. Settled means none is running at one
        look; that look is what ``before_call`` compares with. Without threads of the
        candidate's it costs one listing of the process's threads."""
        start = now = self._theirs()
        pause, began = POLL_S[0], time.monotonic()
        while True:
            spent = {t: task.cpu_ns - (start[t].cpu_ns if t in start else 0)
                     for t, task in now.items()}
            if over := sorted((t for t, ns in spent.items() if ns > SPIN_NS), key=int):
                return self._refusal(over, f"kept running {when}")
            busy = sorted((t for t, task in now.items() if task.state in RUNNING), key=int)
            if not busy:
                break
            if time.monotonic() - began > SETTLE_S:
                return self._refusal(busy, f"were still running {when}")
            time.sleep(pause)
            pause = min(pause * 2, POLL_S[1])
            now = self._theirs()
        self.spun_ns += sum(spent.values())
        self.settled = now
        return None

    def _refusal(self, tids: list[str], what: str) -> str | None:
        if not tids:
            return None
        names = [thread_name(tid, self.pid) for tid in tids]
        shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
        return (f"the candidate started {len(names)} native thread(s) that {what} "
                f"({shown}): not allowed, all work must finish inside forward (threads "
                f"beyond the {self.pool} of the existing OpenMP pool may stay parked, idle)")
