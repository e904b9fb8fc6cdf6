"""What the candidate's process maps as code, held by the judge while its calls run.

The judge checks the files a candidate's process maps as code by their symbols when its run
ends (``retime.loaded_code``). A library used in every call and unmapped after the last one
would be gone by then. So once the calls are counted (the worker's seccomp filter is on
from the end of the warm-up: no new executable mapping can appear after it), the judge
reads the process's maps and opens every file of code outside the trusted folders, keeping
the descriptors (a file unmapped or unlinked later stays readable) and the digest of its
bytes (a file rewritten later is refused). The check at the end covers these files and those
mapped then; between them they are every file of code the calls could have run.

The hold also reads each thread's seccomp mode from ``/proc`` (where the filter is built for
the machine, ``seccomp.supported``): a process whose filter is not on (the candidate kept it
from being installed, whatever the worker reports) could map new code after the hold, and
is refused.

    watch = CodeWatch(worker.interpreter, trusted)   # the driver calls watch() once
    ...
    problems = watch.problems() + check_process(pid, policy, trusted, held=watch.files())
    watch.close()
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

from cuda_agent.build.mapped import (
    MAX_CODE_FILES,
    Opened,
    mapped_files,
    open_mapped,
    written_code,
)
from cuda_agent.build.symbols import MAX_CODE_BYTES, digest_fd
from cuda_agent.judge import seccomp

SECCOMP_FILTER = "2"
"""A thread's ``Seccomp:`` field in ``/proc/PID/task/TID/status`` under a filter."""


class HeldCode:
    """The files of code a process mapped at one look, held open, and what the look found
    wrong; ``close`` lets the descriptors go."""

    def __init__(self, files: list[Opened], problems: list[str]):
        self.files, self.problems = files, problems

    def close(self) -> None:
        files, self.files = self.files, []
        for opened in files:
            if opened.fd is not None:
                os.close(opened.fd)


def hold_mapped_code(pid: int, trusted: Iterable[Path]) -> HeldCode:
    """Open every file ``pid`` maps as code outside ``trusted`` folders (a file the judge
    cannot open is a problem), with the digest of its bytes now, and check that every
    thread of ``pid`` runs under a seccomp filter. As many files and bytes as the check at
    the end reads, no more (``mapped.MAX_CODE_FILES``, ``symbols.MAX_CODE_BYTES``)."""
    prefixes = tuple(str(Path(folder)).rstrip("/") + "/" for folder in trusted)
    # the filter first: once it is on, the maps read next hold every file of code to come
    problems = [f"{name}: no seccomp filter (mode {mode}): new native code could be loaded "
                "after the judge's snapshot of what the process maps"
                for name, mode in (unfiltered_threads(pid) if seccomp.supported() else ())]
    problems += [f"{name}: readable memory is executable (personality READ_IMPLIES_EXEC): "
                 "the seccomp filter cannot tell new code from data" for name in
                 implied_exec_threads(pid)]
    with contextlib.suppress(OSError):  # the maps read below says so
        problems += [f"{where} is mapped as code and also shared or writable (a view that "
                     "could write it, or executable at once): its bytes could change unseen"
                     for where in written_code(pid)]
    try:
        found = [m for m in mapped_files(pid) if not m.where.startswith(prefixes)]
    except OSError as exc:
        return HeldCode([], [*problems, "what the process maps could not be read: "
                                        f"{exc.strerror or exc}"])
    if len(found) > MAX_CODE_FILES:
        return HeldCode([], [*problems, f"the process maps {len(found)} distinct files of "
                                        "code outside the trusted folders (more than "
                                        f"{MAX_CODE_FILES}): not allowed"])
    files, read = [], 0
    for mapped in found:
        try:
            fd = open_mapped(pid, mapped)
            info = os.fstat(fd)
            read += info.st_size
        except OSError as exc:
            problems.append(f"{mapped.where} holds code the judge cannot check "
                            f"(unreadable: {exc.strerror or exc}): not allowed")
            continue
        files.append(Opened(mapped, fd, digest_fd(fd) if read <= MAX_CODE_BYTES else None,
                            info.st_ctime_ns))
    return HeldCode(files, problems)


def unfiltered_threads(pid: int) -> list[tuple[str, str]]:
    """(thread, its seccomp mode) of each thread of ``pid`` not under a seccomp filter; a
    process whose threads cannot be read is one such "thread"."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError as exc:
        return [(f"process {pid}", f"unreadable: {exc.strerror or exc}")]
    found = []
    for tid in tids:
        try:
            status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
        except OSError:  # a thread that ended
            continue
        mode = next((line.split(":", 1)[1].strip() for line in status.splitlines()
                     if line.startswith("Seccomp:")), "absent")
        if mode != SECCOMP_FILTER:
            found.append((f"thread {tid}", mode))
    return found


READ_IMPLIES_EXEC = 0x0400000


def implied_exec_threads(pid: int) -> list[str]:
    """Each thread of ``pid`` whose personality makes every readable mapping executable
    (the filter looks for ``PROT_EXEC`` in a call's arguments; this flag adds it later)."""
    found = []
    for tid in _threads(pid):
        try:
            value = int(Path(f"/proc/{pid}/task/{tid}/personality").read_text(), 16)
        except (OSError, ValueError):  # a thread that ended
            continue
        if value & READ_IMPLIES_EXEC:
            found.append(f"thread {tid}")
    return found


def _threads(pid: int) -> list[str]:
    try:
        return os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []


class CodeWatch:
    """The call driver's ``at_counted`` callback: on its first call (in the driver's
    thread, the worker waiting for the judge's answer) it holds what the candidate's
    process maps (``hold_mapped_code``). Never raises: what goes wrong is a problem."""

    def __init__(self, pid_of: Callable[[], int | None], trusted: Iterable[Path],
                 others: Callable[[], int] | None = None):
        """``others``: how many processes the worker has besides itself (another process
        could hold what this one may not: a writable mapping of its code)."""
        self.pid_of, self.trusted, self.others = pid_of, tuple(trusted), others
        self.held: HeldCode | None = None
        self._lock = threading.Lock()
        self._closed = False

    def __call__(self) -> None:
        with self._lock:
            if self.held is not None or self._closed:
                return
            try:
                pid = self.pid_of()
                self.held = HeldCode([], ["the candidate's interpreter could not be found to "
                                          "hold what it maps"]) if pid is None \
                    else hold_mapped_code(pid, self.trusted)
                others = self.others() if self.others is not None else 0
                if others:
                    self.held.problems.append(
                        f"the process had {others} other process(es) when its calls were "
                        "counted: what they map is not held")
            except Exception as exc:  # whatever the candidate did, the driver goes on
                self.held = HeldCode([], [f"what the process maps could not be held: "
                                          f"{type(exc).__name__}: {str(exc)[:200]}"])

    def problems(self) -> list[str]:
        """What the hold found wrong; that no hold was taken is a problem itself."""
        with self._lock:
            if self.held is None:
                return ["the judge took no snapshot of the code the process mapped while its "
                        "calls ran"]
            return list(self.held.problems)

    def files(self) -> list[Opened]:
        with self._lock:
            return list(self.held.files) if self.held is not None else []

    def close(self) -> None:
        """Let the held files go; a later call holds nothing."""
        with self._lock:
            self._closed = True
            if self.held is not None:
                self.held.close()
