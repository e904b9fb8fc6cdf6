"""The Ray side of ``RayJudgePool``: candidates shipped as file contents, and the judge actor.

Nothing here imports ray: ``RayJudgePool`` wraps ``JudgeActor`` with ``ray.remote`` when it
starts. A candidate travels as ``{"kind", "files": {relative path: bytes}}`` (what the judge
would read of it, at most ``MAX_SHIP_BYTES``) or, for a built-in solution, as
``{"ref": "builtin:NAME"}``; the actor writes the files into a private folder and judges
that, so the trainer's folder need not be visible on the machine that judges.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

from cuda_agent.execution.pool_worker import serve_job
from cuda_agent.judge.candidate import Candidate, CandidateError
from cuda_agent.tasks.loaders import BUILTIN_PREFIX

MAX_SHIP_BYTES = 8 * 1024 * 1024
"""The most a shipped candidate may hold, all files together."""


def pack_candidate(ref: str | Path) -> dict[str, Any]:
    """Read the files of ``ref`` that the judge would read, ready to send to another machine.

    Raises ``CandidateError`` for a candidate the judge would refuse (no model_new.py,
    symbolic links, too many or too large files) or one larger than ``MAX_SHIP_BYTES``.
    """
    ref = str(ref)
    if ref.startswith(BUILTIN_PREFIX):
        return {"ref": ref}  # shipped with the package on every machine
    candidate = Candidate.from_ref(ref)
    files: dict[str, bytes] = {}
    total = 0
    with tempfile.TemporaryDirectory(prefix="cuda-agent-pack-") as tmp:
        root = candidate.snapshot(Path(tmp))  # the judge's own rules of what is read
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            data = path.read_bytes()
            total += len(data)
            if total > MAX_SHIP_BYTES:
                raise CandidateError(f"{ref}: more than {MAX_SHIP_BYTES // 2**20} MiB to "
                                     "ship; a shipped candidate must be smaller")
            files[path.relative_to(root).as_posix()] = data
    return {"kind": candidate.kind, "files": files}


def unpack_candidate(shipped: dict[str, Any], dest: Path) -> str:
    """Write a packed candidate into ``dest``; returns the reference to judge."""
    if "ref" in shipped:
        return str(shipped["ref"])
    root = dest.resolve()
    for rel, data in shipped["files"].items():
        path = (root / rel).resolve()
        if not path.is_relative_to(root) or path == root:
            raise CandidateError(f"{rel}: a shipped path must stay inside the candidate")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return str(root / "model_new.py") if shipped["kind"] == "file" else str(root)


class JudgeActor:
    """One judge on one GPU (given by Ray) or on the CPU; serves one job at a time.

    Ray sets ``CUDA_VISIBLE_DEVICES`` for an actor with ``num_gpus=1`` before its
    ``__init__`` runs; nothing here touches CUDA before that.
    """

    def __init__(self, judge_config: dict[str, Any], device: str):
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            raise RuntimeError("CUDA was initialised before the judge actor had its GPU")
        if device == "cpu":
            os.environ["CUDA_VISIBLE_DEVICES"] = ""
        from cuda_agent.judge import Judge, JudgeConfig

        config = JudgeConfig(**judge_config).model_copy(
            update={"keep_warm": True, "device": device})
        self._judge = Judge(config)

    def pid(self) -> int:
        """The actor's process id; answering it also means the actor is ready."""
        return os.getpid()

    def serve(self, job: dict[str, Any]) -> dict[str, Any]:
        """Judge one job (see ``pool_worker``): the reply is the worker's reply dict."""
        with tempfile.TemporaryDirectory(prefix="cuda-agent-shipped-") as tmp:
            try:
                ref = unpack_candidate(job["candidate"], Path(tmp))
            except (CandidateError, OSError, KeyError) as exc:
                return {"id": job["id"], "ok": False, "poisoned": False,
                        "reason": f"candidate not unpacked: {exc}"}
            return serve_job(self._judge, {**job, "candidate": ref})

    def stop_tree(self) -> int:
        """SIGKILL every process this actor started (the judge's workers); returns how many.

        Runs beside a hung ``serve`` (the actor takes two calls at once), so the pool can
        clean up before it kills the actor itself.
        """
        from cuda_agent.procs import descendants

        victims = descendants(os.getpid())
        for pid in victims:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        return len(victims)

    def close(self) -> None:
        """Stop the judge's spare workers."""
        self._judge.close()
