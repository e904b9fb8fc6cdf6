"""The file tools of an episode: paths confined to its workspace, listing, and the diff.

A client's path is relative to the workspace. Absolute paths, ``..``, NUL bytes and paths
that leave the workspace through a symbolic link are refused with 400 and the reason. The
fixed files of the workspace (the reference, the binding layer, utils/) and its
``.cuda-agent`` record are read-only. Callers hold the episode's lock, so no command of the
same episode can swap a link between the check and the use.
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from cuda_agent.service.errors import ApiError, bad_request
from cuda_agent.workspace.init import META_DIR, READ_ONLY

MAX_PATH = 1024
SNAPSHOT_FILE_BYTES = 512 * 1024
SKIPPED_DIRS = (META_DIR, "build")


@dataclass(frozen=True)
class FileEntry:
    """One listed path: ``kind`` is 'file', 'dir' or 'link' (links are not followed)."""

    path: str
    kind: str
    size: int


@dataclass(frozen=True)
class WorkspaceDiff:
    """Changes of the text files since the episode opened."""

    diff: str
    added: tuple[str, ...]
    removed: tuple[str, ...]
    changed: tuple[str, ...]
    truncated: bool


def inside(root: Path, raw: str) -> Path:
    """The real path of ``raw`` inside ``root``; ``ApiError(400)`` if it is not allowed."""
    if not isinstance(raw, str) or not raw or len(raw) > MAX_PATH or "\x00" in raw:
        raise bad_request(f"path must be 1-{MAX_PATH} characters without NUL")
    rel = PurePosixPath(raw)
    if rel.is_absolute():
        raise bad_request(f"{raw!r}: absolute paths are refused; give a path relative to the "
                          "workspace")
    if ".." in rel.parts:
        raise bad_request(f"{raw!r}: '..' is refused; give a path inside the workspace")
    real = (root / rel).resolve()
    if not real.is_relative_to(root):
        raise bad_request(f"{raw!r}: leaves the workspace through a symbolic link")
    return real


def read_text(root: Path, raw: str, limit: int) -> tuple[str, int]:
    """The UTF-8 text of a file and its size in bytes."""
    path = inside(root, raw)
    if not path.is_file():
        raise ApiError(404 if not path.exists() else 400,
                       f"{raw!r}: {'no such file' if not path.exists() else 'not a file'}")
    size = path.stat().st_size
    if size > limit:
        raise bad_request(f"{raw!r}: {size} bytes; read_file returns at most {limit}")
    try:
        return path.read_bytes().decode("utf-8"), size
    except UnicodeDecodeError:
        raise bad_request(f"{raw!r}: not a UTF-8 text file") from None


def write_text(root: Path, raw: str, content: str) -> int:
    """Write ``content`` (creating folders); returns the bytes written."""
    path = inside(root, raw)
    rel = path.relative_to(root).as_posix()
    if rel == "." or rel.split("/")[0] == META_DIR or rel in READ_ONLY:
        raise bad_request(f"{raw!r}: read-only (the reference, the binding layer and utils/ "
                          "are fixed)")
    if path.exists() and not path.is_file():
        raise bad_request(f"{raw!r}: exists and is not a regular file")
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.parent.resolve().is_relative_to(root):
        raise bad_request(f"{raw!r}: leaves the workspace through a symbolic link")
    data = content.encode("utf-8")
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
    fd = os.open(path, flags, 0o644)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    return len(data)


def list_entries(root: Path, raw: str, limit: int) -> tuple[list[FileEntry], bool]:
    """Every path under ``raw`` (sorted, links not followed); True if cut at ``limit``."""
    top = inside(root, raw)
    if not top.is_dir():
        raise ApiError(404 if not top.exists() else 400, f"{raw!r}: not a folder")
    entries: list[FileEntry] = []
    for folder, dirs, files in os.walk(top):
        here = Path(folder)
        dirs[:] = sorted(d for d in dirs if not (here == root and d == META_DIR))
        for name in [*dirs, *sorted(files)]:
            path = here / name
            kind = "link" if path.is_symlink() else "dir" if path.is_dir() else "file"
            size = path.lstat().st_size if kind != "dir" else 0
            entries.append(FileEntry(path.relative_to(root).as_posix(), kind, size))
            if len(entries) >= limit:
                return sorted(entries, key=lambda e: e.path), True
    return sorted(entries, key=lambda e: e.path), False


def text_files(root: Path) -> dict[str, str]:
    """The workspace's text files (no links, no build output, none over 512 KiB)."""
    found: dict[str, str] = {}
    for folder, dirs, files in os.walk(root):
        here = Path(folder)
        dirs[:] = [d for d in dirs if not (here == root and d in SKIPPED_DIRS)]
        for name in files:
            path = here / name
            if (path.is_symlink() or not path.is_file()
                    or path.stat().st_size > SNAPSHOT_FILE_BYTES):
                continue
            try:
                found[path.relative_to(root).as_posix()] = path.read_bytes().decode("utf-8")
            except (UnicodeDecodeError, OSError):
                continue
    return found


def diff(before: dict[str, str], after: dict[str, str], limit: int) -> WorkspaceDiff:
    """A unified diff (``a/PATH`` to ``b/PATH``) of the text files, cut at ``limit`` bytes."""
    parts: list[str] = []
    size, truncated = 0, False
    for path in sorted(set(before) | set(after)):
        old, new = before.get(path), after.get(path)
        if old == new:
            continue
        lines = difflib.unified_diff(
            (old or "").splitlines(keepends=True), (new or "").splitlines(keepends=True),
            "/dev/null" if old is None else f"a/{path}",
            "/dev/null" if new is None else f"b/{path}")
        text = "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n"
                       for line in lines)
        if size + len(text.encode()) > limit:
            truncated = True
            break
        parts.append(text)
        size += len(text.encode())
    return WorkspaceDiff(
        "".join(parts),
        added=tuple(sorted(set(after) - set(before))),
        removed=tuple(sorted(set(before) - set(after))),
        changed=tuple(sorted(p for p in set(before) & set(after) if before[p] != after[p])),
        truncated=truncated)
