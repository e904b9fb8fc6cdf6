"""Candidates: a workspace folder or a single KernelBench-style file defining ``ModelNew``.

From a workspace only ``model_new.py`` and ``kernels/`` are read, and they are copied to a
private snapshot first, so nothing the agent changes later affects a judgement under way.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from cuda_agent.build import sources
from cuda_agent.tasks.loaders import BUILTIN_PREFIX, builtin_dir

MAX_FILES = sources.MAX_FILES
MAX_BYTES = 8 * 1024 * 1024
SOURCE_SUFFIXES = sources.SOURCE_SUFFIXES + sources.HEADER_SUFFIXES
"""What the snapshot copies: every file the build reads."""


class CandidateError(ValueError):
    """The candidate path is not a usable workspace or file."""


@dataclass(frozen=True)
class Candidate:
    """What the judge judges: ``kind`` 'workspace' (model_new.py + kernels/) or 'file'."""

    kind: Literal["workspace", "file"]
    path: Path

    @classmethod
    def from_ref(cls, ref: str | Path, device: str = "cpu") -> Candidate:
        """A folder is a workspace, a ``.py`` file a single-file candidate; ``builtin:NAME``
        is the shipped solution of a built-in example for ``device``."""
        ref = str(ref)
        if ref.startswith(BUILTIN_PREFIX):
            name = ref[len(BUILTIN_PREFIX):]
            path = builtin_dir() / name / "solution" / device
            if not path.is_dir():
                raise CandidateError(f"{ref}: no shipped {device} solution")
            return cls("workspace", path)
        path = Path(ref).resolve()
        if path.is_dir():
            if not (path / "model_new.py").is_file():
                raise CandidateError(f"{path}: a workspace candidate needs model_new.py")
            return cls("workspace", path)
        if path.is_file() and path.suffix == ".py":
            return cls("file", path)
        raise CandidateError(f"{ref}: not a workspace folder or a .py file")

    def snapshot(self, dest: Path) -> Path:
        """Copy what the judge may read into ``dest``; refuse links and oversized trees."""
        dest.mkdir(parents=True, exist_ok=True)
        if self.kind == "file":
            _copy(self.path, dest / "model_new.py")
            return dest
        _copy(self.path / "model_new.py", dest / "model_new.py")
        kernels = self.path / "kernels"
        if kernels.is_symlink():
            raise CandidateError("kernels/ is a symbolic link; links are not allowed")
        files = sorted(p for p in kernels.rglob("*") if p.is_file() or p.is_symlink()) \
            if kernels.is_dir() else []
        if len(files) > MAX_FILES:
            raise CandidateError(f"kernels/ holds {len(files)} files; at most {MAX_FILES}")
        total = 0
        for src in files:
            rel = src.relative_to(self.path)
            if src.is_symlink():
                raise CandidateError(f"{rel}: symbolic links are not allowed in a candidate")
            if src.suffix not in SOURCE_SUFFIXES:
                continue
            if not src.resolve().is_relative_to(kernels.resolve()):
                raise CandidateError(f"{rel}: reached through a symbolic link; not allowed")
            total += _copy(src, dest / rel)
            if total > MAX_BYTES:
                raise CandidateError(f"kernels/ sources exceed {MAX_BYTES // 2**20} MiB")
        (dest / "kernels").mkdir(exist_ok=True)
        return dest


def _copy(src: Path, dst: Path) -> int:
    if src.is_symlink():
        raise CandidateError(f"{src.name}: symbolic links are not allowed in a candidate")
    if not src.is_file():
        raise CandidateError(f"{src}: missing")
    size = src.stat().st_size
    if size > MAX_BYTES:
        raise CandidateError(f"{src.name}: {size} bytes is too large")
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)
    return size
