"""Confine the candidate's process: what it may read and write, and how its files reach it.

The candidate's worker runs in namespaces of its own (``runner.Confinement``, built on the
local sandbox's ``unshare`` confinement): the whole file system read-only, so the build
cache, the baseline cache, the task store and the workspace cannot be changed; a private
/tmp; no network; a pid namespace, so every process it starts dies with it and it cannot
signal the judge. Its own folder is its only writable place, so the judge copies in what it
needs: ``model_new.py``, the reference weights and, for a single-file candidate that
compiles inline, that candidate's own compile cache (keyed by the hash of its source, so
one candidate can never place a library another will load). Its outputs come back in
device memory the judge lends it (``device_pack``) where that can be had, else in a sealed
memory file the judge created (``shared_pack``).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import sys
from pathlib import Path
from typing import Any

from cuda_agent.judge import device_pack
from cuda_agent.judge.runner import Confinement, Worker
from cuda_agent.paths import home_dir

ISOLATION_NAMESPACES = "namespaces"
ISOLATION_SESSION = "session"


class ConfinementUnavailable(RuntimeError):
    """``confine='on'`` was asked for where namespaces cannot be made."""


def confinement(mode: str, build_dir: Path | None = None) -> Confinement | None:
    """The confinement for candidate workers under ``JudgeConfig.confine``, or None; the
    candidate sees the judge's home and ``build_dir`` (where its module was built, which a
    ``build.cache_dir`` setting may put outside the home), read-only."""
    if mode == "off":
        return None
    from cuda_agent.execution.sandbox import SandboxConfig, hidden_needs
    from cuda_agent.execution.sandbox_local import namespaces_work

    if not namespaces_work():
        if mode == "on":
            raise ConfinementUnavailable(
                "confine='on' but user/mount/pid namespaces cannot be made here (needs "
                "util-linux unshare and root or unprivileged user namespaces)")
        return None
    home = home_dir()
    for folder in (home, build_dir):  # must exist now to be bound into the namespace
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)
    paths = [str(home), *([str(build_dir)] if build_dir is not None else []),
             *(p for p in sys.path if p)]
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return Confinement(keep=tuple(hidden_needs(SandboxConfig(ro_paths=paths))),
                       pack_bytes=min(64 * 2**30, ram // 2))


def isolation(worker: Worker) -> str:
    return ISOLATION_NAMESPACES if worker.confined else ISOLATION_SESSION


def stage_candidate(worker: Worker, snapshot: Path, state: Path, kind: str, device: str,
                    pack_bytes: int | None = None) -> dict[str, Any]:
    """Copy what the candidate's worker reads into its folder (a confined worker reads
    nothing else); return the job's fields that point there. Kept calls come back in a
    device pack of ``pack_bytes`` (one call's outputs and inputs) where one can be had
    (``device_pack.offer``), else in the worker's sealed memory file."""
    fields: dict[str, Any] = {"pack": "memfd"}
    if worker.confined:
        folder = worker.out_dir / "candidate"
        folder.mkdir()
        shutil.copyfile(snapshot / "model_new.py", folder / "model_new.py")
        if state.exists():
            shutil.copyfile(state, worker.out_dir / "state.pt")
        fields.update(candidate_dir=str(folder), state_path=str(worker.out_dir / "state.pt"))
    else:
        fields.update(candidate_dir=str(snapshot), state_path=str(state))
    offer = device_pack.offer(device, pack_bytes)
    if offer.memory is not None:
        worker.device_pack = offer.memory
        fields.update(pack=offer.kind, pack_bytes=offer.memory.size,
                      pack_device=offer.memory.device)
    if kind == "file" and worker.confined:
        inline = worker.out_dir / "inline"
        cached = _inline_cache(snapshot)
        if cached.is_dir():
            shutil.copytree(cached, inline, symlinks=True)
        fields["inline_cache"] = str(inline)
    return fields


INLINE_CACHE_BYTES = 1 << 30
INLINE_CACHE_FILES = 4096
"""The most a single-file candidate's compile cache may hold to be kept (the worker's folder
is the candidate's to fill: a larger one is not kept)."""


def keep_inline_cache(worker: Worker, snapshot: Path, kind: str) -> None:
    """After a file candidate ran confined: keep what it compiled for the next judgement of
    the same source (the first compile of a source wins; nothing else is ever replaced).
    Only regular files and folders are copied, never a link, within ``INLINE_CACHE_BYTES``
    and ``INLINE_CACHE_FILES``; anything else and nothing is kept."""
    inline = worker.out_dir / "inline"
    if kind != "file" or not worker.confined or not _real_dir(inline):
        return
    cached = _inline_cache(snapshot)
    if cached.exists():
        return
    staging = cached.with_name(cached.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        if _copy_plain(inline, staging, [INLINE_CACHE_BYTES, INLINE_CACHE_FILES]):
            staging.rename(cached)
    except OSError:
        pass
    shutil.rmtree(staging, ignore_errors=True)


def _real_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _copy_plain(source: Path, target: Path, left: list[int]) -> bool:
    """Copy the regular files and folders under ``source`` (no links, no special files)
    while ``left`` (bytes, files) lasts; False, leaving a partial copy, when it does not."""
    target.mkdir(parents=True)
    with os.scandir(source) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                if not _copy_plain(Path(entry.path), target / entry.name, left):
                    return False
            elif entry.is_file(follow_symlinks=False):
                size = entry.stat(follow_symlinks=False).st_blocks * 512
                left[0] -= max(size, entry.stat(follow_symlinks=False).st_size)
                left[1] -= 1
                if left[0] < 0 or left[1] < 0:
                    return False
                with open(entry.path, "rb", opener=_no_follow) as src, \
                        open(target / entry.name, "wb") as dst:
                    shutil.copyfileobj(src, dst)
                # times too: ninja rebuilds whatever looks newer than its output
                shutil.copystat(entry.path, target / entry.name, follow_symlinks=False)
            else:
                return False
    return True


def _no_follow(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK)


def lend_inline_cache(worker: Worker, snapshot: Path, kind: str) -> None:
    """Before a staged worker's job: copy in what an earlier process compiled for this file
    candidate (``keep_inline_cache``), so it loads instead of compiling again."""
    if kind != "file" or not worker.confined:
        return
    cached = _inline_cache(snapshot)
    if cached.is_dir():
        shutil.copytree(cached, worker.out_dir / "inline", symlinks=True, dirs_exist_ok=True)


def _inline_cache(snapshot: Path) -> Path:
    digest = hashlib.sha256((snapshot / "model_new.py").read_bytes()).hexdigest()[:24]
    root = home_dir() / "inline"
    root.mkdir(parents=True, exist_ok=True)
    return root / digest
