"""Confine the candidate's process: what it may read and write, and how its files reach it.

The candidate's worker runs in namespaces of its own (``runner.Confinement``, built on the
local sandbox's ``unshare`` confinement): the whole file system read-only, so the build
cache, the baseline cache, the task store and the workspace cannot be changed; a private
/tmp; no network; a pid namespace, so every process it starts dies with it and it cannot
signal the judge. Its own folder is its only writable place, so the judge copies in what it
needs: ``model_new.py`` and the reference weights. A single-file candidate's ``load_inline``
is built by the judge, not in this process (``inline_serve``): the module is loaded from
the judge's cache, which the candidate can read but never write. Its outputs come back in
device memory the judge lends it (``device_pack``) where that can be had, else in a sealed
memory file the judge created (``shared_pack``).
"""

from __future__ import annotations

import os
import shutil
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


def confinement(mode: str) -> Confinement | None:
    """The confinement for candidate workers under ``JudgeConfig.confine``, or None."""
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
    home.mkdir(parents=True, exist_ok=True)  # must exist now to be bound into the namespace
    paths = [str(home), *(p for p in sys.path if p)]
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return Confinement(keep=tuple(hidden_needs(SandboxConfig(ro_paths=paths))),
                       pack_bytes=min(64 * 2**30, ram // 2))


def isolation(worker: Worker) -> str:
    return ISOLATION_NAMESPACES if worker.confined else ISOLATION_SESSION


def stage_candidate(worker: Worker, snapshot: Path, state: Path, device: str,
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
    return fields
