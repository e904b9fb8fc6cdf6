"""Live processes as Linux /proc shows them: parent, session and start time of each.

The judge's workers, the sandbox and the pools all find what a process left behind the same
way: take one ``snapshot()`` and ask it for a process's descendants or a session's members.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import os
import signal
from collections.abc import Callable


@dataclasses.dataclass(frozen=True)
class Proc:
    ppid: int
    sid: int
    start: int
    """Start time after boot, in clock ticks (field 22 of /proc/PID/stat)."""


def snapshot() -> dict[int, Proc]:
    """Every process readable in /proc (those that vanish while it is read are skipped)."""
    out = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
            out[int(entry.name)] = Proc(int(fields[1]), int(fields[3]), int(fields[19]))
        except (OSError, IndexError, ValueError):
            continue
    return out


def descendants(root: int, procs: dict[int, Proc] | None = None) -> list[int]:
    """Every process below ``root``, parents before their children."""
    children: dict[int, list[int]] = {}
    for pid, proc in (snapshot() if procs is None else procs).items():
        children.setdefault(proc.ppid, []).append(pid)
    found: list[int] = []
    seen, todo = {root}, [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in seen:
                seen.add(child)
                found.append(child)
                todo.append(child)
    return found


def session_members(sid: int, procs: dict[int, Proc] | None = None) -> list[int]:
    """The processes whose session id is ``sid`` (its leader included)."""
    return [pid for pid, proc in (snapshot() if procs is None else procs).items()
            if proc.sid == sid]


def alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (of any user; a zombie counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_PR_SET_PDEATHSIG = 1


def die_with_parent() -> Callable[[], None]:
    """A call for a child between fork and exec (libc is loaded here, in the parent: the
    child only calls it): the child gets SIGKILL when the thread that started it ends."""
    prctl = _libc().prctl
    return lambda: prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)
