"""One long-lived judge worker of the pool (see docs/pool.md); started by ``JudgePool``.

Only the standard library is imported here; the worker pins its GPU by setting
``CUDA_VISIBLE_DEVICES`` before anything initialises CUDA. Messages on the pipe are plain
dicts: in ``{"id", "task", "candidate", "_debug_sleep_s"}`` or ``None`` (stop); out
``{"ready": pid}``, then per job ``{"id", "ok": True, "result": {...}}`` or
``{"id", "ok": False, "reason": str, "poisoned": bool}``.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any

POISONED_EXIT = 70
"""Exit status of a worker whose own CUDA context failed: the pool replaces it."""

_POISON_MARKS = ("illegal memory access", "CUDA error", "device-side assert", "CUBLAS_STATUS")


def worker_main(conn: Connection, gpu: int | None, judge_config: dict[str, Any]) -> None:
    """Serve jobs from ``conn`` one at a time until told to stop or the pipe closes."""
    os.setsid()  # its own process group, so the pool can kill it with what it started
    # torch may already be imported (by the package), but CUDA must not be initialised yet:
    # the driver reads CUDA_VISIBLE_DEVICES when torch first touches the GPU
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        raise RuntimeError("CUDA was initialised before the worker pinned its GPU")
    os.environ["CUDA_VISIBLE_DEVICES"] = "" if gpu is None else str(gpu)
    from cuda_agent.judge import Judge, JudgeConfig

    config = JudgeConfig(**judge_config).model_copy(
        update={"keep_warm": True, "device": "cpu" if gpu is None else "cuda"})
    judge = Judge(config)
    try:
        conn.send({"ready": os.getpid()})
        while True:
            try:
                job = conn.recv()
            except EOFError:
                return
            if job is None:
                return
            reply = serve_job(judge, job)
            conn.send(reply)
            if reply.get("poisoned"):
                os._exit(POISONED_EXIT)
    finally:
        judge.close()


def serve_job(judge: Any, job: dict[str, Any]) -> dict[str, Any]:
    """Judge one job message with ``judge``; the reply message (shared by both pools)."""
    from cuda_agent.judge import Candidate
    from cuda_agent.judge.judge import JudgeError
    from cuda_agent.results import to_dict
    from cuda_agent.tasks.task import Task

    if job.get("_debug_sleep_s"):
        time.sleep(float(job["_debug_sleep_s"]))  # tests only: stands in for a hung worker
    try:
        candidate = Candidate.from_ref(job["candidate"], judge.device)
        result = judge.judge(Task(**job["task"]), candidate)
        return {"id": job["id"], "ok": True, "result": to_dict(result)}
    except JudgeError as exc:
        return {"id": job["id"], "ok": False, "reason": f"judge error: {exc}",
                "poisoned": False}
    except Exception as exc:  # noqa: BLE001 - any failure is reported, never swallowed
        text = f"{type(exc).__name__}: {exc}"
        poisoned = judge.device == "cuda" and any(m in text for m in _POISON_MARKS)
        tail = traceback.format_exc(limit=3)[-600:]
        return {"id": job["id"], "ok": False, "reason": f"worker error: {text}\n{tail}",
                "poisoned": poisoned}
