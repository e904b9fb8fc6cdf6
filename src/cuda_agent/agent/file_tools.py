"""File tools over one workspace: read, write, edit, multi-edit, glob, grep.

Every path is relative to the workspace root. Absolute paths, ``..``, and symlinks that
lead out of the workspace are refused; so are writes to the fixed files (the reference,
the binding layer, ``utils/`` and ``.cuda-agent/``). A refusal raises ``ToolError`` whose
message is shown to the model.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath
from typing import Any

from cuda_agent.workspace.init import META_DIR, READ_ONLY

FIXED_DIRS = ("utils", META_DIR)
SKIP_DIRS = (META_DIR, "__pycache__", ".git")


class ToolError(ValueError):
    """A tool call that cannot be carried out; the message tells the model why."""


class WorkspaceFiles:
    """Path checks and file operations confined to ``root``."""

    def __init__(self, root: Path, max_results: int = 200):
        self.root = Path(root).resolve()
        self.max_results = max_results

    def resolve(self, path: str, write: bool = False) -> Path:
        """The absolute path of ``path`` inside the workspace, or ToolError."""
        if not path.strip():
            raise ToolError("path is empty")
        pure = PurePosixPath(path)
        if pure.is_absolute() or path.startswith("~"):
            raise ToolError(f"{path}: absolute paths are not allowed; use a path relative to "
                            "the workspace root, e.g. kernels/my_op.cpp")
        if ".." in pure.parts:
            raise ToolError(f"{path}: '..' is not allowed; paths stay inside the workspace")
        full = (self.root / pure).resolve()
        if full != self.root and self.root not in full.parents:
            raise ToolError(f"{path}: leads outside the workspace (through a symlink)")
        rel = full.relative_to(self.root).as_posix()
        if write and (rel in READ_ONLY or rel.split("/")[0] in FIXED_DIRS):
            raise ToolError(f"{path}: is a fixed file of the workspace and cannot be changed; "
                            "write model_new.py and files under kernels/")
        return full

    def _text(self, path: str) -> tuple[Path, str]:
        full = self.resolve(path)
        if not full.is_file():
            raise ToolError(f"{path}: no such file" if not full.exists() else
                            f"{path}: is a directory, not a file")
        try:
            return full, full.read_text()
        except UnicodeDecodeError:
            raise ToolError(f"{path}: not a text file") from None

    def read(self, path: str, offset: int = 1, limit: int = 2000) -> str:
        _, text = self._text(path)
        lines = text.splitlines()
        if offset < 1 or limit < 1:
            raise ToolError("offset and limit must be at least 1")
        if lines and offset > len(lines):
            raise ToolError(f"{path}: offset {offset} is past the end ({len(lines)} lines)")
        shown = lines[offset - 1 : offset - 1 + limit]
        body = "\n".join(f"{offset + i:6d}\t{line}" for i, line in enumerate(shown))
        rest = len(lines) - (offset - 1 + len(shown))
        more = f"\n[{rest} more lines; read on with offset={offset + len(shown)}]" if rest else ""
        return (body or f"{path}: empty file") + more

    def write(self, path: str, content: str) -> str:
        full = self.resolve(path, write=True)
        if full.is_dir():
            raise ToolError(f"{path}: is a directory")
        full.parent.mkdir(parents=True, exist_ok=True)
        existed = full.exists()
        full.write_text(content)
        lines = content.count("\n") + (0 if content.endswith("\n") or not content else 1)
        return f"{'overwrote' if existed else 'created'} {path} ({lines} lines)"

    def edit(self, path: str, edits: list[dict[str, Any]]) -> str:
        """Apply ``edits`` ({old, new, replace_all}) in order; all or none."""
        full, text = self._text(path)
        self.resolve(path, write=True)
        total = 0
        for i, edit in enumerate(edits):
            old, new = edit["old"], edit["new"]
            where = f"edit {i + 1}: " if len(edits) > 1 else ""
            if old == "":
                raise ToolError(f"{path}: {where}'old' is empty; give the exact text to replace")
            if old == new:
                raise ToolError(f"{path}: {where}'old' and 'new' are the same")
            count = text.count(old)
            if count == 0:
                raise ToolError(f"{path}: {where}'old' was not found (it must match exactly, "
                                "whitespace included); read the file and copy the text"
                                + ("; no edit was applied" if len(edits) > 1 else ""))
            if count > 1 and not edit.get("replace_all", False):
                raise ToolError(f"{path}: {where}'old' occurs {count} times; give more "
                                "surrounding text to make it unique, or set replace_all"
                                + ("; no edit was applied" if len(edits) > 1 else ""))
            text = text.replace(old, new)
            total += count
        full.write_text(text)
        return f"edited {path}: {total} replacement(s)"

    def glob(self, pattern: str) -> str:
        _check_pattern(pattern)
        found = sorted(p.relative_to(self.root).as_posix() for p in self.root.glob(pattern)
                       if p.is_file() and not self._skipped(p))
        if not found:
            return f"no files match {pattern}"
        head = found[: self.max_results]
        more = len(found) - len(head)
        return "\n".join(head) + (f"\n[{more} more files]" if more else "")

    def grep(self, pattern: str, path: str | None = None) -> str:
        try:
            regex = re.compile(pattern)
        except re.error as exc:
            raise ToolError(f"invalid regular expression {pattern!r}: {exc}") from None
        if path:
            _check_pattern(path)
        files = self.root.glob(path) if path else self.root.rglob("*")
        hits: list[str] = []
        total = 0
        for file in sorted(files):
            if not file.is_file() or self._skipped(file):
                continue
            try:
                text = file.read_text()
            except (UnicodeDecodeError, OSError):
                continue
            rel = file.relative_to(self.root).as_posix()
            for n, line in enumerate(text.splitlines(), 1):
                if regex.search(line):
                    total += 1
                    if len(hits) < self.max_results:
                        hits.append(f"{rel}:{n}: {line[:300]}")
        if not hits:
            return f"no matches for {pattern!r}"
        more = total - len(hits)
        return "\n".join(hits) + (f"\n[{more} more matches]" if more else "")

    def _skipped(self, path: Path) -> bool:
        resolved = path.resolve()
        if resolved != self.root and self.root not in resolved.parents:
            return True
        return any(part in SKIP_DIRS for part in path.relative_to(self.root).parts)


def _check_pattern(pattern: str) -> None:
    pure = PurePosixPath(pattern)
    if not pattern or pure.is_absolute() or ".." in pure.parts:
        raise ToolError(f"{pattern!r}: patterns are relative to the workspace, without '..'")
