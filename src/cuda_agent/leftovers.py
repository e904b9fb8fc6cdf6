"""Folders a process makes for its own use, named by its pid, and swept once it is gone.

A judge killed outright (SIGKILL, out of memory, a pool replacing a hung worker) runs no
cleanup, so the candidate's snapshot, the workers' folders and the build's scratch would
stay in /tmp or the cache for good. Each such folder is named ``PREFIX<pid>-XXXX``; the next
judge on the machine removes those of its own user whose process no longer exists, and
ends any process still working in one.

    folder = owned_dir("cuda-agent-judge-")          # /tmp/cuda-agent-judge-1234-ab12cd
    sweep("cuda-agent-judge-")                       # removes the dead ones
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

from cuda_agent.procs import alive

MIN_AGE_S = 60.0
"""A folder younger than this is kept whatever its pid says: a process of another pid
namespace sharing the folder may have made it a moment ago."""


def owned_dir(prefix: str, parent: str | Path | None = None) -> Path:
    """A fresh folder ``parent/PREFIX<pid>-XXXX`` (``parent``: the system's temporary one)."""
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=parent))


def sweep(prefixes: str | tuple[str, ...], parent: str | Path | None = None) -> int:
    """Remove this user's ``PREFIX<pid>-*`` folders in ``parent`` (one prefix or several,
    read in one pass) whose process is gone and that are older than ``MIN_AGE_S``; the
    number removed."""
    parent = Path(parent or tempfile.gettempdir())
    prefixes = (prefixes,) if isinstance(prefixes, str) else prefixes
    removed = 0
    with contextlib.suppress(OSError):
        for entry in parent.iterdir():
            pid = _owner(entry.name, prefixes)
            if pid is None or alive(pid):
                continue
            try:
                info = entry.lstat()
            except OSError:
                continue
            if (info.st_uid != os.getuid() or not entry.is_dir() or entry.is_symlink()
                    or time.time() - info.st_mtime < MIN_AGE_S):
                continue
            _kill_inside(entry)
            shutil.rmtree(entry, ignore_errors=True)
            removed += 1
    return removed


def _kill_inside(folder: Path) -> None:
    """SIGKILL this user's processes working in ``folder`` (a compiler of a dead judge that
    nothing else would end: one blocked on a read uses no CPU, so no CPU limit ends it)."""
    inside = str(folder.resolve())
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        if cwd == inside or cwd.startswith(inside + "/"):
            with contextlib.suppress(OSError):
                os.kill(int(entry.name), signal.SIGKILL)


def _owner(name: str, prefixes: tuple[str, ...]) -> int | None:
    for prefix in prefixes:
        if name.startswith(prefix):
            pid = name[len(prefix):].split("-", 1)[0]
            return int(pid) if pid.isdigit() else None
    return None
