"""Native threads in the candidate's process: none that candidate code starts may outlive it.

Work handed to a thread finishes outside the timed call, where no clock sees it. A Python
thread running once the candidate is loaded is refused by ``roles.candidate``; this module
watches the operating system's view, which sees Python threads (named as Python names them)
and threads started from C++ or CUDA host code alike: the process's threads are listed
(``/proc/self/task``) once the worker is settled, before any candidate code runs, and again
after loading, after every checked call and after every timed call. A thread that is new
and still alive at one of those points is refused; one that has dropped the process's
memory (exiting: a C++ ``join`` returns then, microseconds before the thread leaves
``/proc``: in 2,000 joins on a 2-core machine one was still listed) runs no more code and
is not counted.

The pools a candidate may use without starting threads exist before that first listing:
PyTorch's OpenMP pool (shared with the extension's ``#pragma omp``: one ``libgomp.so.1``),
and on CUDA the driver's own threads. A team larger than the pool starts threads and is
refused with the pool's size in the message.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import torch

TASKS = Path("/proc/self/task")


def native_threads() -> set[str]:
    """The thread ids of this process (empty where ``/proc`` is not available)."""
    try:
        return set(os.listdir(TASKS))
    except OSError:
        return set()


def runs_user_code(tid: str) -> bool:
    """Whether thread ``tid`` still has the process's memory: one that is exiting has
    dropped it (its ``stat`` shows a virtual size of 0) and can run no more code of the
    candidate's. ``join`` returns about then, some microseconds before the thread's task
    leaves ``/proc``."""
    try:
        stat = (TASKS / tid / "stat").read_text()
    except OSError:
        return False  # gone
    fields = stat[stat.rfind(")") + 2:].split()
    try:
        return int(fields[20]) != 0  # field 23 of stat, vsize; the first two precede these
    except (IndexError, ValueError):
        return True


def _name(tid: str) -> str:
    """A Python thread's own name, else the operating system's (``comm``)."""
    for thread in threading.enumerate():
        if str(thread.native_id) == tid:
            return thread.name
    try:
        return (TASKS / tid / "comm").read_text().strip() or tid
    except OSError:
        return tid


class ThreadWatch:
    """The threads present before candidate code ran, and the check against them."""

    def __init__(self, known: set[str], pool: int):
        self.known = known
        self.pool = pool

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
        self.known |= native_threads()

    def started(self) -> list[str]:
        """Names of the threads alive now that were not there when the watch settled."""
        return [_name(tid) for tid in sorted(native_threads() - self.known)
                if runs_user_code(tid)]

    def problem(self, when: str) -> str | None:
        """A message naming the candidate's threads still alive ``when``, or None."""
        new = self.started()
        if not new:
            return None
        shown = ", ".join(new[:3]) + (", ..." if len(new) > 3 else "")
        return (f"the candidate started {len(new)} native thread(s) still running {when} "
                f"({shown}): not allowed, all work must finish inside forward (an OpenMP "
                f"team may use at most the {self.pool} thread(s) of the existing pool)")
