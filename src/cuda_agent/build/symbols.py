"""What built code can call: an object's or shared object's undefined symbols, checked
against a policy (``symbol_rules``), judge-side: a workspace's objects before they are
linked, a single-file candidate's shared objects, or what a live process loaded.

A run-time trace sees only the operators that pass through the dispatcher while it
watches; the symbols show every route the code was linked to take, also the ones around
the dispatcher (``at::native``, ``at::cpu``, ``at::cuda`` kernels) and to other libraries.
It reads the files with GNU binutils (``nm``, ``c++filt``). It cannot see a function
reached by an address the code computes itself (parsing ``/proc/self/maps`` or a loaded
library's symbol table in memory): dynamic lookup and ``mprotect`` are refused to make that
the hard way, not an impossible one.

    problems = check_objects([("kernels/add.cu", obj)], workspace_policy("g++"))
    problems = check_tree(torch_extensions_dir, single_file_policy(guard.ALLOWED))
    problems = check_process(pid, single_file_policy(guard.ALLOWED), trusted=[sys.prefix])
    print("\\n".join(map(str, problems)))
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import hashlib
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Literal

from cuda_agent.build import bounded, callers, symbol_rules

RUNTIME_LIBRARIES = ("libc.so.6", "libm.so.6", "libstdc++.so.6", "libgcc_s.so.1",
                     "libgomp.so.1")
OPTIONAL_RUNTIME = ("libmvec.so.1", "ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1")
STATIC_RUNTIME = ("-print-libgcc-file-name", "-print-file-name=libc_nonshared.a")
"""Archives linked into every module: libgcc's helpers, and libc's (``atexit``)."""
ELF_REL, ELF_DYN = 1, 3
MAX_SYMBOLS = 100_000
"""The most symbols the judge reads from the files of one check (a build's kernel objects
together, or one file), defined and undefined: an honest kernel has hundreds, and one
small source can make the assembler write millions, each held in the judge's memory."""
MAX_SYMBOL_BYTES = 32 << 20
"""The most bytes of ``nm`` output (and, apart, of demangled names) read for one check."""


class SymbolToolError(RuntimeError):
    """The tools or libraries the symbol check reads are missing, or a file is not ELF."""


class NotElfError(SymbolToolError):
    """A file to check is not an ELF object or shared object."""


class TooManySymbols(Exception):
    """A file lists more symbols than the judge reads (``MAX_SYMBOLS``, ``MAX_SYMBOL_BYTES``):
    the candidate's doing, a problem of the check rather than an error of the tools."""

    def __init__(self, where: str, what: str):
        super().__init__(f"{where} lists {what}")
        self.problem = Problem(where, what, "more than the judge reads from one build's "
                               "objects or one file", "lists")


@dataclasses.dataclass(frozen=True)
class Symbol:
    name: str
    """As the file spells it, without a version (``memcpy``, ``_ZN2at4_ops2mm4callE...``)."""
    plain: str
    """Demangled (``at::_ops::mm::call(at::Tensor const&, at::Tensor const&)``)."""
    weak: bool = False
    """A weak reference: it links though nothing defines it, and binds when loaded to
    whatever the process has loaded by that name."""


@dataclasses.dataclass(frozen=True)
class Problem:
    where: str
    """The source or file that holds the reference (``kernels/add.cu``)."""
    symbol: str
    rule: str
    verb: str = "calls"

    def __str__(self) -> str:
        return f"{self.where} {self.verb} {self.symbol} ({self.rule}): not allowed"


@dataclasses.dataclass(frozen=True)
class Policy:
    """Which undefined symbols built code may have (``symbol_rules`` says why)."""

    kind: Literal["workspace", "single_file"]
    runtime: frozenset[str] = frozenset()
    """Workspace: every name the C/C++ runtime defines."""
    allowed_ops: frozenset[str] = frozenset()
    """Single file: the operators the run-time guard allows (``guard.ALLOWED``)."""

    def refusal(self, symbol: Symbol, own: bool = False, linked: bool = False
                ) -> str | None:
        """Why ``symbol`` is refused, or None; ``own`` when the candidate's objects define
        it, ``linked`` when the link that follows must still resolve it (an object's strong
        reference)."""
        if self.kind == "workspace":
            return symbol_rules.workspace(symbol.name, symbol.plain, own, self.runtime,
                                          linked)
        return symbol_rules.single_file(symbol.name, symbol.plain, self.allowed_ops)


def workspace_policy(cxx: str = "g++", cache_dir: Path | None = None) -> Policy:
    """Kernels built against the fixed layer with the compiler ``cxx`` (the runtime's names
    kept in ``cache_dir``)."""
    return Policy("workspace", runtime=runtime_symbols(cxx, cache_dir))


def single_file_policy(allowed_ops: Iterable[str]) -> Policy:
    """A shared object built with ``torch/extension.h`` (``load_inline``)."""
    return Policy("single_file", allowed_ops=frozenset(allowed_ops))


def check_file(path: Path, policy: Policy, where: str | None = None) -> list[Problem]:
    """The problems of one object or shared object (named ``where`` in them). A shared
    object that defines a refused C name is refused too: its calls to it may go to the C
    library's (symbol interposition); a refused import that only the C++ runtime's own code
    linked into it calls passes (``callers``)."""
    require_tools()  # also where the file's symbols are cached: missing tools always raise
    path = Path(path)
    where = where or str(path)
    shared = _elf_type(path, where) == ELF_DYN
    budget = _Budget()
    try:
        defined_entries = _symbols(path, shared, False, where, budget)
        defined = {name for name, _ in defined_entries}
        problems = _judge(where, _symbols(path, shared, True, where, budget), defined,
                          policy, not shared, budget)
        problems += [Problem(where, symbol.plain, "PyTorch's own kernel, compiled in from "
                                                  "its headers", "defines")
                     for symbol in _demangled(tuple(defined_entries), where, budget)
                     if symbol_rules.compiled_kernel(symbol.plain)]
    except TooManySymbols as exc:
        return [exc.problem]
    if shared:
        problems = [p for p in problems if not (p.symbol in callers.RUNTIME_CALLERS and
                                                callers.runtime_only(path, p.symbol))]
        problems += [Problem(where, name, f"{symbol_rules.common(name)}; calls to it "
                                          "may reach the system's", "defines")
                     for name in sorted(defined & symbol_rules.INTERPOSABLE)]
    return problems


def check_objects(objects: Iterable[tuple[str, Path]], policy: Policy) -> list[Problem]:
    """The problems of objects (``.o``) linked into one module: ``(where, path)`` each; a
    name one of them defines is the candidate's own for the others (unless a rule refuses
    it)."""
    objects, budget = list(objects), _Budget()
    try:
        own = {name for where, path in objects
               for name, _ in _symbols(Path(path), False, False, where, budget)}
        problems = []
        for where, path in objects:
            problems += _judge(where, _symbols(Path(path), False, True, where, budget), own,
                               policy, True, budget)
    except TooManySymbols as exc:
        return [exc.problem]
    return problems


def check_tree(folder: Path, policy: Policy) -> list[Problem]:
    """The problems of every shared object (``*.so``) under ``folder``, by path relative to
    it; none when the folder does not exist."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    problems = []
    for path in sorted(folder.rglob("*.so")):
        if path.is_file() and not path.is_symlink():
            problems += _check_readable(path, policy, str(path.relative_to(folder)))
    return problems


def check_process(pid: int, policy: Policy, trusted: Iterable[Path],
                  own: Callable[[str, int], bool] | None = None,
                  held: Iterable[Any] = ()) -> list[Problem]:
    """``mapped.check_process``: the problems of every file a live process maps as code
    (``held``: ``mapped.Opened`` files from an earlier look)."""
    from cuda_agent.build import mapped  # the process side; it imports this module

    return mapped.check_process(pid, policy, trusted, own, held)


def mapped_code(pid: int) -> list[tuple[str, Path]]:
    """``mapped.mapped_code``."""
    from cuda_agent.build import mapped

    return mapped.mapped_code(pid)


MAX_CHECKED_BYTES = 256 << 20
"""A file of code larger than this is refused unread (a candidate could map anything)."""
MAX_CODE_BYTES = 1 << 30
"""The files of code checked together (``FileChecks``) hold at most this many bytes."""


def require_tools() -> None:
    """Raise ``SymbolToolError`` where binutils are missing (the judge's machine lacks them,
    not the candidate's fault)."""
    for name in ("nm", "c++filt"):
        _tool(name)


class FileChecks:
    """The problems of files read through open descriptors (a live process's code), each
    content checked once and cached by its digest, at most ``MAX_CHECKED_BYTES`` a file and
    ``MAX_CODE_BYTES`` together; a file the judge cannot read or parse is a problem of its
    own (a candidate's file may be anything), missing tools still raise."""

    def __init__(self, policy: Policy):
        self.policy = policy
        self.problems: list[Problem] = []
        self.digests: set[str] = set()
        self.read = 0

    def add(self, fd: int, where: str, digest: str | None = None) -> None:
        """Check the file open as ``fd`` (named ``where``); ``digest``: its bytes' digest
        when the judge first read it, which they must still have."""
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                self.problems.append(_uncheckable(where, "not a regular file"))
                return
            if info.st_size > MAX_CHECKED_BYTES or self.read + info.st_size > MAX_CODE_BYTES:
                self.problems.append(_uncheckable(
                    where, f"over {MAX_CHECKED_BYTES >> 20} MiB"
                    if info.st_size > MAX_CHECKED_BYTES
                    else f"over {MAX_CODE_BYTES >> 20} MiB of code in all"))
                return
            self.read += info.st_size
            with tempfile.TemporaryDirectory(prefix="cuda-agent-symbols-") as folder:
                copy = Path(folder) / "checked"  # private: what is checked cannot change
                found = _copy_fd(fd, copy)
                if digest is not None and found != digest:
                    self.problems.append(Problem(
                        where, "code that changed after the judge first read it",
                        "the file was written while mapped", "holds"))
                elif found not in self.digests:
                    self.digests.add(found)
                    self.problems += [Problem(where, *found_problem) for found_problem
                                      in _checked_content(_Content(found, copy), self.policy)]
        except NotElfError:
            self.problems.append(_uncheckable(where, "not an ELF object or shared object"))
        except OSError as exc:
            self.problems.append(_unreadable(where, exc))


def digest_fd(fd: int) -> str | None:
    """The SHA-256 of the regular file open as ``fd``, or None where ``FileChecks`` would
    not read it (too large, not a regular file, unreadable)."""
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_CHECKED_BYTES:
            return None
        return _copy_fd(fd, None)
    except OSError:
        return None


def _copy_fd(fd: int, copy: Path | None) -> str:
    """The SHA-256 of the file open as ``fd``, read from its start (and written to ``copy``
    when given); a file that grows past ``MAX_CHECKED_BYTES`` while read is an error."""
    digest, offset = hashlib.sha256(), 0
    with contextlib.ExitStack() as stack:
        out = stack.enter_context(copy.open("xb")) if copy is not None else None
        while chunk := os.pread(fd, 1 << 20, offset):
            offset += len(chunk)
            if offset > MAX_CHECKED_BYTES:
                raise OSError(errno.EFBIG, "grew while read")
            digest.update(chunk)
            if out is not None:
                out.write(chunk)
    return digest.hexdigest()


def _checked_content(content: _Content, policy: Policy) -> tuple[tuple[str, str, str], ...]:
    """``check_file``'s problems (symbol, rule, verb) of one content, cached by its digest."""
    return _CHECKED.get((content, policy), lambda: tuple(
        (p.symbol, p.rule, p.verb) for p in check_file(content.path, policy, "-")))


def _uncheckable(where: str, reason: str) -> Problem:
    return Problem(where, "code the judge cannot check", reason, "holds")


def _unreadable(where: str, exc: OSError) -> Problem:
    return _uncheckable(where, f"unreadable: {exc.strerror or exc}")


def _check_readable(path: Path, policy: Policy, where: str) -> list[Problem]:
    """``FileChecks`` of one file by its path (never blocking on a pipe)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        return [_unreadable(where, exc)]
    try:
        checks = FileChecks(policy)
        checks.add(fd, where)
        return checks.problems
    finally:
        os.close(fd)


def _judge(where: str, entries: list[tuple[str, str]], own: set[str], policy: Policy,
           linked: bool, budget: _Budget) -> list[Problem]:
    problems = []
    for symbol in _demangled(tuple(dict.fromkeys(entries)), where, budget):
        rule = policy.refusal(symbol, symbol.name in own, linked and not symbol.weak)
        if rule is not None:
            problems.append(Problem(where, symbol.plain, rule))
    return problems


@functools.lru_cache(maxsize=4)
def runtime_symbols(cxx: str = "g++", cache_dir: Path | None = None) -> frozenset[str]:
    """Every name the C/C++ runtime that ``cxx`` links defines: libc (shared and static),
    libm, libmvec, libstdc++, libgcc (shared and static), libgomp and the dynamic loader.
    Kept in ``cache_dir`` (when given) under a key of the libraries' paths and dates."""
    files = _runtime_files(cxx)
    key = hashlib.sha256("\0".join(f"{f}:{f.stat().st_mtime_ns}:{f.stat().st_size}"
                                    for f in files).encode()).hexdigest()[:24]
    cached = Path(cache_dir) / f"runtime-symbols-{key}.txt" if cache_dir else None
    if cached is not None and cached.is_file():
        return frozenset(cached.read_text().split())
    names: set[str] = set()
    for path in files:
        names.update(name for name, _ in _nm(path, *([] if path.suffix == ".a" else ["-D"]),
                                             "--defined-only"))
    if cached is not None:
        cached.parent.mkdir(parents=True, exist_ok=True)
        handle, staging = tempfile.mkstemp(dir=cached.parent, suffix=".tmp")
        with os.fdopen(handle, "w") as out:
            out.write("\n".join(sorted(names)))
        os.replace(staging, cached)
    return frozenset(names)


def _runtime_files(cxx: str) -> list[Path]:
    compiler = shutil.which(cxx)
    if compiler is None:
        raise SymbolToolError(f"the C++ compiler '{cxx}' is needed to find the C/C++ runtime "
                              "the symbol check allows")
    files = []
    for library in (*RUNTIME_LIBRARIES, *OPTIONAL_RUNTIME):
        found = _compiler_file(compiler, f"-print-file-name={library}")
        if found is None and library in RUNTIME_LIBRARIES:
            raise SymbolToolError(f"{cxx} does not find {library}, which the symbol check "
                                  "reads for the names the C/C++ runtime defines")
        files += [found] if found is not None else []
    for flag in STATIC_RUNTIME:
        found = _compiler_file(compiler, flag)
        files += [found] if found is not None else []
    return files


def _compiler_file(compiler: str, flag: str) -> Path | None:
    done = subprocess.run([compiler, flag], capture_output=True, text=True, timeout=60)
    path = Path(done.stdout.strip())
    return path.resolve() if done.returncode == 0 and path.is_absolute() and path.exists() \
        else None


def _symbols(path: Path, shared: bool, undefined: bool, where: str, budget: _Budget
             ) -> list[tuple[str, str]]:
    """Cached by content (a candidate sets its files' dates as it likes); the path is not
    resolved, so ``/proc/PID/root/...`` stays inside that process's view of its files.
    Raises ``TooManySymbols`` once the check's ``budget`` is spent."""
    with path.open("rb") as handle:
        digest = hashlib.file_digest(handle, "sha256").hexdigest()
    flags = (["-D"] if shared else []) + ["--undefined-only" if undefined else "--defined-only"]
    try:
        names, size = _LISTINGS.get((digest, shared, undefined), lambda: _nm_sized(
            path, *flags, max_lines=MAX_SYMBOLS - budget.symbols,
            max_bytes=MAX_SYMBOL_BYTES - budget.bytes))
    except bounded.OutputLimit as exc:
        raise budget.spent(where, exc.lines, exc.size) from None
    budget.take(where, len(names), size)
    return list(names)


class _Budget:
    """What one check has read so far (``MAX_SYMBOLS``, ``MAX_SYMBOL_BYTES``)."""

    def __init__(self) -> None:
        self.symbols = self.bytes = self.demangled = 0

    def take(self, where: str, symbols: int, size: int) -> None:
        self.symbols, self.bytes = self.symbols + symbols, self.bytes + size
        if self.symbols > MAX_SYMBOLS or self.bytes > MAX_SYMBOL_BYTES:
            raise self.spent(where, 0, 0)

    def spent(self, where: str, symbols: int, size: int) -> TooManySymbols:
        if self.symbols + symbols > MAX_SYMBOLS:
            return TooManySymbols(where, f"over {MAX_SYMBOLS} symbols")
        return TooManySymbols(where, f"over {MAX_SYMBOL_BYTES >> 20} MiB of symbol names")


@dataclasses.dataclass(frozen=True)
class _Content:
    """A file's bytes, known by their digest; ``path`` holds them (not part of the key)."""

    digest: str
    path: Path = dataclasses.field(compare=False, hash=False)


def _listing_size(value: tuple[tuple[tuple[str, str], ...], int]) -> int:
    return value[1] + 64 * len(value[0])  # the names, and the tuples that hold them


def _problems_size(problems: tuple[tuple[str, str, str], ...]) -> int:
    return sum(sys.getsizeof(p[0]) + 64 for p in problems)


_LISTINGS = bounded.Cache(1024, 64 << 20, _listing_size)
"""An object's symbols by its digest and what was listed: a build's objects are listed twice
(the calls checked, the links made), an unchanged object again by the next build."""
_CHECKED = bounded.Cache(256, 16 << 20, _problems_size)
"""A content's problems by its digest and the policy (a file loaded by many workers)."""


def _nm(path: Path, *flags: str) -> list[tuple[str, str]]:
    """(name, type letter) that ``nm -P`` lists for ``path``, versions cut
    (``memcpy@GLIBC_2.14`` -> ``memcpy``); read whole, for the system's own libraries."""
    return list(_nm_sized(path, *flags)[0])


def _nm_sized(path: Path, *flags: str, max_lines: int | None = None,
              max_bytes: int | None = None) -> tuple[tuple[tuple[str, str], ...], int]:
    """``_nm``'s list and the bytes ``nm`` printed for it, read as ``nm`` runs; raises
    ``bounded.OutputLimit`` past ``max_lines`` lines or ``max_bytes`` bytes."""
    names, size = [], 0
    with bounded.Lines([_tool("nm"), "-P", *flags, str(path)], max_lines, max_bytes,
                       timeout=120) as out:
        for line in out:
            size += len(line) + 1
            parts = line.split()
            if len(parts) >= 2 and len(parts[1]) == 1 and not parts[0].endswith(":"):
                names.append((parts[0].split("@", 1)[0], parts[1]))
    if out.returncode != 0:
        raise SymbolToolError(f"nm cannot read {path}: {out.stderr.strip()[:300]}")
    return tuple(names), size


def _demangled(entries: tuple[tuple[str, str], ...], where: str, budget: _Budget
               ) -> list[Symbol]:
    """``entries`` with their demangled names; ``TooManySymbols`` once those of the check
    are longer than the judge reads (a mangled name can stand for a much longer one)."""
    if not entries:
        return []
    symbols, room = [], MAX_SYMBOL_BYTES - budget.demangled
    with tempfile.NamedTemporaryFile("w", prefix="cuda-agent-names-") as names:
        names.write("\n".join(n for n, _ in entries))
        names.flush()
        with bounded.Lines([_tool("c++filt")], len(entries), room, timeout=120,
                           stdin=Path(names.name)) as out:
            try:
                for (name, kind), text in zip(entries, out, strict=False):
                    symbols.append(Symbol(name, text, kind in "wv"))
                    budget.demangled += len(text) + 1
                for _ in out:  # none left: read to the end, for the exit status
                    break
            except bounded.OutputLimit:
                if len(symbols) < len(entries):
                    raise TooManySymbols(where, f"over {MAX_SYMBOL_BYTES >> 20} MiB of "
                                                "demangled symbol names") from None
    if out.returncode != 0 or len(symbols) != len(entries):
        raise SymbolToolError(f"c++filt failed: {out.stderr.strip()[:300]}")
    return symbols


def _tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise SymbolToolError(f"{name} (GNU binutils) is needed to check which symbols built "
                              "code calls; install binutils")
    return found


def _elf_type(path: Path, where: str) -> int:
    with path.open("rb") as handle:
        head = handle.read(18)
    if len(head) < 18 or head[:4] != b"\x7fELF":
        raise NotElfError(f"{where} is not an ELF object or shared object")
    return int.from_bytes(head[16:18], "little" if head[5] == 1 else "big")
