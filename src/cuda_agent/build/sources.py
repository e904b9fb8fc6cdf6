"""What of a workspace a build reads: its kernel files, checked once, and each source's view.

A build reads ``kernels/`` and nothing else of the workspace, and reads it once: every file
is taken by name (letters, digits, ``_``, ``-`` and ``.`` only: a name is passed to
compilers, and nvcc hands its paths to a shell), as a regular file (no links, pipes or
devices), within a size budget, into memory. Each source then compiles in a view of its
own, a folder holding those bytes of the headers and of that one source only, so the
object's cache key (the headers' bytes, the source's bytes, the command and the toolchain)
is everything the compile could read of the workspace: a source that includes another
source, ``model_new.py`` or a precompiled header finds nothing, and a workspace edited
while it builds cannot give an object under another content's key.

    files = kernel_files(root, (".cpp",), max_sources=64)
    folder = write_view(files, files.sources[0], scratch / "view")
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import stat
import struct
from pathlib import Path

HEADER_SUFFIXES = (".h", ".hpp", ".cuh", ".inc")
SOURCE_SUFFIXES = (".cpp", ".cu")
MAX_FILE_BYTES = 16 << 20
MAX_TOTAL_BYTES = 64 << 20
MAX_FILES = 200
MAX_PATH = 160
"""Longest path under the workspace: the view adds its own folder, which must stay within
the file system's limits."""
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
_REFUSED_SUFFIXES = (".gch", ".pch", ".pcm", ".gcm")
"""Precompiled headers and modules: a compiler loads them in place of a header."""


@dataclasses.dataclass(frozen=True)
class KernelFiles:
    """The kernel sources and headers of a workspace, as read once (paths relative to the
    workspace), and the digest of the headers (with the binding layer's registry)."""

    sources: tuple[tuple[Path, bytes], ...]
    headers: tuple[tuple[Path, bytes], ...]
    header_hash: str


def kernel_files(root: Path, wanted: tuple[str, ...], max_sources: int, registry: bytes
                 ) -> KernelFiles:
    """Read ``root/kernels``; raise ValueError naming the first file that may not be built
    (a bad name, a link or special file, a source for another device, too many or too big)."""
    kernels = root / "kernels"
    if kernels.is_symlink() or not kernels.is_dir():
        raise ValueError(f"{kernels}: no kernels/ folder" if not kernels.is_symlink()
                         else "kernels/ is a symbolic link; links are not allowed")
    sources, headers, total = [], [], 0
    for path in _walk(kernels):
        rel = path.relative_to(root)
        if path.suffix not in SOURCE_SUFFIXES + HEADER_SUFFIXES:
            continue
        if len(str(rel)) > MAX_PATH:
            raise ValueError(f"{str(rel)[:60]}...: a path under the workspace may be at most "
                             f"{MAX_PATH} characters")
        if len(sources) + len(headers) >= MAX_FILES:
            raise ValueError(f"kernels/ holds over {MAX_FILES} sources and headers")
        if path.suffix in SOURCE_SUFFIXES and path.suffix not in wanted:
            raise ValueError(f"{rel}: CUDA sources need --device cuda; the CPU target builds "
                             "kernels/*.cpp with g++")
        data = _read(path, rel)
        total += len(data)
        if total > MAX_TOTAL_BYTES:
            raise ValueError(f"kernels/ sources and headers exceed {MAX_TOTAL_BYTES >> 20} MiB")
        (sources if path.suffix in SOURCE_SUFFIXES else headers).append((rel, data))
    if not sources:
        raise ValueError("kernels/ holds no sources (*.cpp" +
                         (", *.cu" if ".cu" in wanted else "") + ")")
    if len(sources) > max_sources:
        raise ValueError(f"kernels/ holds {len(sources)} sources; at most {max_sources} are "
                         "built")
    digest = hashlib.sha256(registry)
    for rel, data in headers:
        digest.update(str(rel).encode() + b"\0" + hashlib.sha256(data).digest())
    return KernelFiles(tuple(sources), tuple(headers), digest.hexdigest())


def write_view(files: KernelFiles, source: Path, folder: Path) -> Path:
    """A folder holding the headers and ``source`` as read (``folder/kernels/...``)."""
    data = dict(files.sources)[source]
    for rel, content in (*files.headers, (source, data)):
        target = folder / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
    return folder


def _walk(kernels: Path) -> list[Path]:
    """Every regular file under ``kernels`` (sorted); refuses bad names, links, special
    files and precompiled headers anywhere in the tree."""
    found: list[Path] = []
    for folder, dirs, names in os.walk(kernels, followlinks=False):
        for name in (*dirs, *names):
            path = Path(folder) / name
            rel = path.relative_to(kernels.parent)
            if not _NAME.match(name):
                raise ValueError(f"{rel}: a name in kernels/ may hold only letters, digits, "
                                 "'_', '-' and '.' (and may not start with '-' or '.')")
            if name.endswith(_REFUSED_SUFFIXES):
                raise ValueError(f"{rel}: precompiled headers and modules are not allowed")
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode):
                raise ValueError(f"{rel}: symbolic links are not allowed")
            if name in names and not stat.S_ISREG(mode):
                raise ValueError(f"{rel}: not a regular file")
            if name in names:
                found.append(path)
    return sorted(found)


def _read(path: Path, rel: Path) -> bytes:
    """The file's bytes, opened without following a link, at most ``MAX_FILE_BYTES``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise ValueError(f"{rel}: cannot be read ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise ValueError(f"{rel}: not a regular file")
        data = handle.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise ValueError(f"{rel}: over {MAX_FILE_BYTES >> 20} MiB")
    return data


LTO_SECTIONS = (b".gnu.lto_", b".gnu.debuglto_")


def lto_sections(path: Path) -> list[str]:
    """Names of the link-time-optimisation sections in the ELF object ``path`` (an
    ``asm()`` block can write them into any object): their code is not what the symbol
    check reads. Raises ValueError for a file that is not a 64-bit ELF object."""
    try:
        return _lto_sections(path)
    except struct.error as exc:
        raise ValueError(f"{path.name}: a section table the judge does not read") from exc


def _lto_sections(path: Path) -> list[str]:
    with open(path, "rb") as handle:
        head = handle.read(64)
        if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
            raise ValueError(f"{path.name}: not a 64-bit little-endian ELF object")
        shoff, = struct.unpack_from("<Q", head, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", head, 0x3A)
        if shnum > 65535 or shentsize < 64 or shstrndx >= shnum:
            raise ValueError(f"{path.name}: a section table the judge does not read")
        handle.seek(shoff)
        table = handle.read(shentsize * shnum)
        entry = shstrndx * shentsize
        names_off, names_size = struct.unpack_from("<QQ", table, entry + 0x18)
        if names_size > MAX_FILE_BYTES:
            raise ValueError(f"{path.name}: a section-name table over 16 MiB")
        handle.seek(names_off)
        names = handle.read(names_size)
    found = []
    for i in range(shnum):
        offset, = struct.unpack_from("<I", table, i * shentsize)
        name = names[offset:names.find(b"\0", offset)]
        if name.startswith(LTO_SECTIONS):
            found.append(name.decode(errors="replace"))
    return found
