"""The CPU time of a worker's process, read by the judge from outside it.

A call is timed by the judge's wall clock between its ``go`` and its ``done``; a thread of
the worker's process can work outside that window (before ``go``, after ``done``), or
beside the worker's own steps inside it (the packing the stand-ins' time takes out), where
no wall clock sees it. The kernel counts every nanosecond any thread of a process runs,
the exited threads' included, in the process's CPU clock, and any process may read
another's (``clock_getcpuclockid``: the clock id ``(~pid << 3) | CPUCLOCK_SCHED``), to the
nanosecond, in one system call. The main thread's own share comes from its ``schedstat``
(ns), read through a descriptor opened before any candidate code runs. Nothing the
worker's process does changes what these read: a thread cannot leave its process's clock,
and a process the worker starts is refused (``runner``).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import NamedTuple

CPUCLOCK_SCHED = 2
"""The kernel's clock of a process's scheduled run time (``sum_exec_runtime``)."""


class CpuMark(NamedTuple):
    """A process's CPU time at one moment (ns): all its threads', and its main thread's."""

    process_ns: int
    main_ns: int


def process_clock_id(pid: int) -> int:
    """The id of ``pid``'s CPU-time clock, as ``clock_getcpuclockid`` makes it."""
    return ((~pid) << 3) | CPUCLOCK_SCHED


class ProcessCpu:
    """Reads process ``pid``'s CPU time; opened while only the judge's code runs there."""

    def __init__(self, pid: int):
        self.pid = pid
        self.clock = process_clock_id(pid)
        self.main = os.open(f"/proc/{pid}/task/{pid}/schedstat", os.O_RDONLY)
        self.budget = thread_budget(pid)
        """How many threads the process's calls may keep busy at once (``thread_budget``)."""

    def read(self) -> CpuMark | None:
        """The process's CPU time so far, or None once it is gone."""
        try:
            return CpuMark(time.clock_gettime_ns(self.clock),
                           int(os.pread(self.main, 128, 0).split()[0]))
        except (OSError, ValueError, IndexError):
            return None

    def close(self) -> None:
        if self.main >= 0:
            os.close(self.main)
            self.main = -1


def open_process(pid: int | None) -> ProcessCpu | None:
    """``ProcessCpu(pid)``, or None where there is no such process or the kernel keeps no
    CPU clock for it that the judge may read."""
    if pid is None:
        return None
    try:
        cpu = ProcessCpu(pid)
    except OSError:
        return None
    if cpu.read() is None:
        cpu.close()
        return None
    return cpu


def thread_budget(pid: int) -> int:
    """The threads a call of ``pid`` may keep busy at once: the CPUs it may run on, or
    fewer where its environment gives OpenMP fewer threads (``OMP_NUM_THREADS``, as eager
    runs with). Read before any candidate code runs; both only shrink what the judge
    credits a call with running in parallel."""
    try:
        cpus = len(os.sched_getaffinity(pid))
    except OSError:
        cpus = os.cpu_count() or 1
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        environ = []
    for entry in environ:
        if entry.startswith(b"OMP_NUM_THREADS="):
            first = entry.split(b"=", 1)[1].split(b",")[0].strip()
            if first.isdigit() and int(first) > 0:
                return max(1, min(cpus, int(first)))
    return max(1, cpus)
