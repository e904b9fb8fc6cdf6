"""What a live process maps as code, checked by its symbols (``symbols``), judge-side.

The judge reads ``/proc/PID/maps`` and checks each executable file outside the trusted
folders once: a file is its device and inode (hard links and repeated mappings are one),
and a content is checked once (copies are one). A file can be opened while the process
runs and held (``open_mapped``): it stays readable once the process unmaps or unlinks it,
so a look taken while the calls run and one at the end cover every file mapped since the
earlier look (no new one can be mapped once the worker's seccomp filter is on).

    held = [Opened(m, fd, digest_fd(fd)) for m in mapped_files(pid)
            for fd in [open_mapped(pid, m)]]
    problems = check_process(pid, policy, trusted=[sys.prefix], held=held)
"""

from __future__ import annotations

import dataclasses
import errno
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from cuda_agent.build.symbols import FileChecks, Policy, Problem

MAX_CODE_FILES = 64
"""More distinct files of code outside the trusted folders than this are refused unread (a
candidate could map one file by thousands of names, or thousands of copies)."""


@dataclasses.dataclass(frozen=True)
class MappedFile:
    """One file a process maps as code."""

    where: str
    """The path as the process names it (``/tmp/ext/ext.so``, ``/tmp/x.so (deleted)``)."""
    inode: tuple[str, int]
    """Its device and inode, as the process's maps give them."""
    span: str
    """One of its mappings (``7f0100000000-7f0100001000``): its name in ``map_files``."""

    @property
    def deleted(self) -> bool:
        return self.where.endswith(" (deleted)")


@dataclasses.dataclass(frozen=True)
class Opened:
    """A mapped file and, once opened (``open_mapped``), the descriptor it is read by, the
    digest of its bytes then (``symbols.digest_fd``) and its change time (``st_ctime_ns``):
    bytes written and written back leave the digest as it was, but the change time moves
    with every write, through ``write`` or a shared mapping, and no process can set it
    back."""

    mapped: MappedFile
    fd: int | None = None
    digest: str | None = None
    ctime_ns: int | None = None


def mapped_files(pid: int) -> list[MappedFile]:
    """Each file ``pid`` maps executable, once per device and inode."""
    found: dict[tuple[str, int], MappedFile] = {}
    for fields in _maps(pid):
        if "x" not in fields[1] or not fields[5].startswith("/"):
            continue  # anonymous code (a JIT's) and [vdso] have no file to check
        key = (fields[3], int(fields[4]))
        found.setdefault(key, MappedFile(fields[5], key, fields[0]))
    return list(found.values())


def written_code(pid: int, code: Iterable[tuple[str, int]] | None = None) -> list[str]:
    """The files ``pid`` maps writable and executable at once, or shared but not as code
    while it (or ``code``, as (device, inode)) also maps them as code. Pages made writable
    once take later writes without a fault (a shared mapping made read-only becomes
    writable again without one), and a private one without touching the file, so nothing
    (the change time included) records them: code must have no such mapping."""
    rows = _maps(pid)
    code = set(code or ()) | {(f[3], int(f[4])) for f in rows
                              if "x" in f[1] and f[5].startswith("/")}
    return sorted({f[5] for f in rows if f[5].startswith("/") and (
        ("w" in f[1] and "x" in f[1]) or (f[1].endswith("s") and (f[3], int(f[4])) in code
                                          and ("w" in f[1] or "x" not in f[1])))})


def _maps(pid: int) -> list[list[str]]:
    """The fields of each line of ``pid``'s memory map that names a file or a region (six
    fields: range, protection, offset, device, inode, name)."""
    with open(f"/proc/{pid}/maps", "rb") as handle:
        lines = handle.read().decode(errors="surrogateescape").splitlines()
    return [fields for line in lines if len(fields := line.split(maxsplit=5)) == 6]


def mapped_code(pid: int) -> list[tuple[str, Path]]:
    """(path as the process names it, a path to read it by) of each file ``pid`` maps
    executable; a deleted one is read through ``/proc/PID/map_files``."""
    return [(m.where, Path(f"/proc/{pid}/map_files/{m.span}") if m.deleted
             else Path(f"/proc/{pid}/root{m.where}")) for m in mapped_files(pid)]


def open_mapped(pid: int, mapped: MappedFile) -> int:
    """A descriptor of the very file ``pid`` maps, readable once it is unmapped or unlinked:
    through ``/proc/PID/map_files`` where the judge may open it there (``CAP_SYS_ADMIN`` or
    ``CAP_CHECKPOINT_RESTORE``), else by its path in the process's view of its files, which
    must still lead to the inode mapped. Raises ``OSError``."""
    try:
        return os.open(f"/proc/{pid}/map_files/{mapped.span}", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        if mapped.deleted:
            raise
    fd = os.open(f"/proc/{pid}/root{mapped.where}",
                 os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    if os.fstat(fd).st_ino != mapped.inode[1]:  # (an overlay's device number differs)
        os.close(fd)
        raise OSError(errno.ESTALE, "another file is at its path now")
    return fd


def check_process(pid: int, policy: Policy, trusted: Iterable[Path],
                  own: Callable[[str, int], bool] | None = None,
                  held: Iterable[Opened] = ()) -> list[Problem]:
    """The problems of every file a live process maps as code, but for those under a
    ``trusted`` folder (the interpreter, torch, the system's libraries) and those ``own``
    says are the judge's (given the name and an open descriptor): read by the judge from
    the process's own view of its files, whatever the process says about it. ``held``:
    files opened at an earlier look, checked with those mapped now (their descriptors stay
    the caller's); one whose bytes changed since is refused."""
    prefixes = tuple(str(Path(folder)).rstrip("/") + "/" for folder in trusted)
    files = {opened.mapped.inode: opened for opened in held}
    for mapped in mapped_files(pid):
        files.setdefault(mapped.inode, Opened(mapped))
    files = {key: opened for key, opened in files.items()
             if not opened.mapped.where.startswith(prefixes)}
    if len(files) > MAX_CODE_FILES:
        return [Problem("the process", f"{len(files)} distinct files of code outside the "
                        "trusted folders", f"more than {MAX_CODE_FILES}", "maps")]
    checks = FileChecks(policy)
    checks.problems += [Problem(where, "code also mapped shared or writable",
                                "a view that could write it, or executable at once: its bytes "
                                "could change unseen", "maps")
                        for where in written_code(pid, files)]
    for opened in files.values():
        where = opened.mapped.where
        try:
            fd = opened.fd if opened.fd is not None else open_mapped(pid, opened.mapped)
        except OSError as exc:
            checks.problems.append(Problem(where, "code the judge cannot check",
                                           f"unreadable: {exc.strerror or exc}", "holds"))
            continue
        try:
            if own is not None and own(where, fd):
                continue  # the judge's own layer: its links come and go with other builds
            if opened.ctime_ns is not None and os.fstat(fd).st_ctime_ns != opened.ctime_ns:
                checks.problems.append(Problem(
                    where, "code that changed after the judge first read it",
                    "the file was written while mapped (its change time moved)", "holds"))
            else:
                checks.add(fd, where, opened.digest)
        finally:
            if opened.fd is None:
                os.close(fd)
    return checks.problems
