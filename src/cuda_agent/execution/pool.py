"""A pool of long-lived judge workers fed from one queue (see docs/pool.md).

    from cuda_agent.execution import JudgePool, PoolConfig
    with JudgePool(PoolConfig()) as pool:        # one worker per visible GPU, or CPU workers
        results = pool.map([(task, "ws/a"), (task, "ws/b")])

Each worker is a child process that owns one GPU (``CUDA_VISIBLE_DEVICES``) or runs on the
CPU, and takes one job at a time, so no two timing jobs share a GPU. A supervisor thread
replaces a worker that dies or overruns ``job_timeout_s`` (killing every process it
started) and retries its job, up to ``retries`` times; every job ends with a
``JudgeResult`` or a ``JobFailed``, never lost.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import threading
import time
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from cuda_agent.execution.backend import (
    Job,
    JobHandle,
    PoolBase,
    judge_result,
)
from cuda_agent.execution.pool_worker import worker_main
from cuda_agent.judge.config import JudgeConfig
from cuda_agent.procs import descendants
from cuda_agent.tasks.task import Task


class PoolConfig(BaseModel):
    """How many judge workers run where, and how stuck or dead workers are handled."""

    gpus: list[int] | None = Field(
        None, description="GPU indices, one worker each. None: every GPU torch sees; "
        "[]: none, judge on the CPU with ``cpu_workers`` workers.")
    cpu_workers: int = Field(1, ge=1, description="Workers when judging on the CPU.")
    jobs_per_gpu: int = Field(
        1, ge=1, description="Judge workers per GPU. Above 1 one job's CPU work (worker "
        "start-up, build, checks) and untimed GPU work overlap another's; the jobs on one "
        "GPU share its turn (JudgeConfig.gpu_lock), held exclusive through every timed "
        "phase, so timings stay exclusive.")
    job_timeout_s: float = Field(
        900.0, gt=0, description="A worker busy with one job longer than this is killed and "
        "replaced; the job is retried.")
    start_timeout_s: float = Field(
        300.0, gt=0, description="A worker not ready this long after starting is replaced.")
    retries: int = Field(
        1, ge=0, description="Retries of a job whose worker died or hung (a candidate that "
        "merely fails is a verdict and is not retried).")
    judge: JudgeConfig = Field(default_factory=JudgeConfig, description="Each worker's judge "
                               "(keep_warm is forced on; device follows the worker).")
    backend: Literal["local", "ray"] = Field(
        "local", description="What ``make_pool`` builds: 'local' worker processes on this "
        "machine, or 'ray' actors on a Ray cluster (the optional extra '[ray]').")
    ray_address: str | None = Field(
        None, description="Ray backend only: None starts (or reuses) a Ray instance on this "
        "machine; 'auto' or 'ray://HOST:10001' joins a running cluster.")


class _Slot:
    """One worker process and the job it holds."""

    def __init__(self, ctx: Any, gpu: int | None, judge: dict[str, Any]):
        self.gpu = gpu
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=worker_main, args=(child, gpu, judge), daemon=True,
                                name=f"judge-worker-{'cpu' if gpu is None else gpu}")
        self.proc.start()
        child.close()
        self.started = time.monotonic()
        self.ready = False
        self.job: Job | None = None
        self.since = 0.0

    def kill(self) -> None:
        """SIGKILL the worker, its process group and every process below it."""
        pid = self.proc.pid
        if pid is not None:
            for victim in [*descendants(pid), pid]:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(victim, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        self.proc.join(5.0)
        self.conn.close()


class JudgePool(PoolBase):
    """Judge workers behind one queue; use as a context manager or call ``close()``."""

    def __init__(self, config: PoolConfig | None = None):
        self.config = config or PoolConfig()
        self._ctx = multiprocessing.get_context("spawn")
        self._init_queue()
        self._slots = [_Slot(self._ctx, gpu, self._judge_for(gpu)) for gpu in self._places()]
        self._thread = threading.Thread(target=self._supervise, name="judge-pool", daemon=True)
        self._thread.start()

    def _places(self) -> list[int | None]:
        gpus, device = self.config.gpus, self.config.judge.device
        if gpus is None:
            gpus = [] if device == "cpu" else _visible_gpus()
        if device == "cpu":
            gpus = []
        if device == "cuda" and not gpus:
            raise ValueError("judge.device is 'cuda' but the pool has no GPU")
        if not gpus:
            return [None] * self.config.cpu_workers
        return [gpu for gpu in gpus for _ in range(self.config.jobs_per_gpu)]

    def _judge_for(self, gpu: int | None) -> dict[str, Any]:
        """The judge config of a worker on ``gpu``: with several per GPU, the GPU's lock."""
        if gpu is None or self.config.jobs_per_gpu == 1 or self._judge.get("gpu_lock"):
            return self._judge
        return {**self._judge, "gpu_lock": str(gpu_lock_path(gpu))}

    def submit(self, task: Task, candidate: str | Path, _debug_sleep_s: float = 0.0
               ) -> JobHandle:
        """Queue judging ``candidate`` (a workspace, a .py file or ``builtin:NAME``).

        ``_debug_sleep_s`` makes the worker sleep before judging: for tests of hung workers.
        """
        with self._lock:
            return self._enqueue(task, str(candidate), _debug_sleep_s)

    def _workers(self) -> list[_Slot]:
        return self._slots

    def worker_pids(self) -> list[int]:
        with self._lock:
            return [slot.proc.pid for slot in self._slots if slot.proc.pid is not None]

    def close(self) -> None:
        """Stop the workers; jobs not finished end as ``JobFailed('pool closed')``."""
        if not self._stop_supervising():
            return
        with self._lock:
            for slot in self._slots:
                if slot.job is not None:  # busy: killed at once, its job ends as failed
                    slot.kill()
                    self._finish(slot.job, None, "pool closed")
                else:
                    with contextlib.suppress(OSError):
                        slot.conn.send(None)
            deadline = time.monotonic() + 10.0
            for slot in self._slots:
                slot.proc.join(max(0.0, deadline - time.monotonic()))
                slot.kill()
            self._fail_queued("pool closed")

    def _wait_for_events(self) -> None:
        wait([s.conn for s in self._slots] + [s.proc.sentinel for s in self._slots],
             timeout=0.1)

    def _dispatch(self) -> None:
        for slot in self._slots:
            if not self._queue:
                return
            if slot.ready and slot.job is None:
                job = self._queue.popleft()
                job.attempts += 1
                job.pid, slot.job, slot.since = slot.proc.pid, job, time.monotonic()
                with contextlib.suppress(OSError):
                    slot.conn.send(job.message)  # a dead worker is found by _check

    def _check(self, slot: _Slot) -> None:
        dead = None
        try:
            while slot.conn.poll():
                dead = self._receive(slot, slot.conn.recv()) or dead
        except (EOFError, OSError):
            pass
        now = time.monotonic()
        if dead is None and not slot.proc.is_alive():
            dead = f"worker died (exit status {slot.proc.exitcode})"
        if dead is None and slot.job is not None and now - slot.since > self.config.job_timeout_s:
            dead = f"worker hung: no result after {self.config.job_timeout_s:g} s"
        if dead is None and not slot.ready and now - slot.started > self.config.start_timeout_s:
            dead = f"worker not ready after {self.config.start_timeout_s:g} s"
        if dead is not None:
            self._replace(slot, dead)

    def _receive(self, slot: _Slot, message: dict[str, Any]) -> str | None:
        """Handle one message; returns a reason when the worker must be replaced."""
        if "ready" in message:
            slot.ready = True
            return None
        job = slot.job
        if job is None or job.id != message.get("id"):
            return "worker answered a job it was not given"
        if message.get("poisoned"):
            return f"worker CUDA context failed: {message.get('reason', '')[:300]}"
        slot.job = None
        if message["ok"]:
            self._finish(job, judge_result(message["result"]), None)
        else:
            self._finish(job, None, message.get("reason", "unknown failure"))
        return None

    def _replace(self, slot: _Slot, reason: str) -> None:
        slot.kill()
        self._replaced += 1
        job = slot.job
        self._slots[self._slots.index(slot)] = _Slot(self._ctx, slot.gpu,
                                                     self._judge_for(slot.gpu))
        if job is None:
            return
        self._retry_or_fail(job, reason)


def gpu_lock_path(gpu: int) -> Path:
    """The lock file of GPU ``gpu`` (shared by every pool of this cuda-agent home)."""
    from cuda_agent.paths import home_dir

    return home_dir() / "locks" / f"gpu{gpu}.lock"


def _visible_gpus() -> list[int]:
    import torch

    return list(range(torch.cuda.device_count()))
