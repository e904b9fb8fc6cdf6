"""The seam every judge pool satisfies, the types they share, and ``make_pool`` (docs/pool.md).

    from cuda_agent.execution import PoolConfig, make_pool
    with make_pool(PoolConfig(backend="ray", ray_address="auto")) as pool:
        results = pool.map([(task, "ws/a"), (task, "ws/b")])

``backend="local"`` gives a ``JudgePool`` (worker processes on this machine),
``backend="ray"`` a ``RayJudgePool`` (Ray actors on a Ray cluster). Both hand out
``JobHandle``s and end every job with a ``JudgeResult`` or a ``JobFailed``.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import deque
from collections.abc import Iterable
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, Self, runtime_checkable

from cuda_agent.results import (
    BaselineSource,
    BuildResult,
    CorrectnessResult,
    JudgeResult,
    ShapeResult,
    SizeChange,
    TimingStats,
)
from cuda_agent.tasks.task import Task

if TYPE_CHECKING:
    from cuda_agent.execution.pool import PoolConfig


@dataclasses.dataclass(frozen=True)
class JobFailed:
    """A job that produced no verdict: its worker kept dying or hanging, or the judge erred."""

    task: str
    reason: str
    attempts: int


@dataclasses.dataclass(frozen=True)
class PoolStats:
    """A snapshot of the pool's progress."""

    workers: int
    queued: int
    running: int
    done: int
    failed: int
    replaced: int


@dataclasses.dataclass
class Job:
    """A job's state, shared by the pool that runs it and the handle that waits for it."""

    id: int
    task: str
    message: dict[str, Any]
    future: Future
    attempts: int = 0
    pid: int | None = None


class JobHandle:
    """A submitted job: ``result()`` blocks for its ``JudgeResult`` or ``JobFailed``."""

    def __init__(self, job: Job):
        self._job = job

    @property
    def id(self) -> int:
        return self._job.id

    @property
    def attempts(self) -> int:
        """How many times the job has been handed to a worker."""
        return self._job.attempts

    @property
    def worker_pid(self) -> int | None:
        """The worker running it now (None while queued or once done)."""
        return self._job.pid

    def done(self) -> bool:
        return self._job.future.done()

    def result(self, timeout: float | None = None) -> JudgeResult | JobFailed:
        return self._job.future.result(timeout)


class PoolBase:
    """What both pools share: queueing, ``map``, ``stats``, the supervisor loop, closing,
    and how a job ends or is retried. The pool provides ``config`` (with ``retries`` and
    ``judge``), calls ``_init_queue()`` (``_lock``, ``_closed``, ``_next_id``, ``_queue``, a
    deque of waiting jobs, and the ``_done`` / ``_failed`` / ``_replaced`` counters) and
    provides ``_thread``, ``submit``, ``close``, ``_workers()``
    (its slots or actors, each with a ``job``), ``_dispatch``, ``_wait_for_events`` and
    ``_check``."""

    config: Any
    _lock: Any
    _closed: Any
    _next_id: int
    _queue: Any
    _done: int
    _failed: int
    _replaced: int

    _thread: Any

    def _init_queue(self) -> None:
        """The queue, its lock, the job ids and counters, and the closed flag."""
        self._judge = self.config.judge.model_dump()
        self._lock = threading.Lock()
        self._queue = deque()
        self._next_id = 0
        self._done = self._failed = self._replaced = 0
        self._closed = threading.Event()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()  # each pool's own

    def _workers(self) -> list[Any]:
        raise NotImplementedError

    def _dispatch(self) -> None:
        """Hand queued jobs to idle, ready workers (called with ``_lock`` held)."""
        raise NotImplementedError

    def _wait_for_events(self) -> None:
        """Block up to about 0.1 s for a worker to answer, start or die."""
        raise NotImplementedError

    def _check(self, worker: Any) -> None:
        """Take a worker's answer, or replace it if it died or overran (``_lock`` held)."""
        raise NotImplementedError

    def _supervise(self) -> None:
        """The supervisor thread: dispatch, wait, check, until the pool closes."""
        try:
            while not self._closed.is_set():
                with self._lock:
                    self._dispatch()
                self._wait_for_events()
                with self._lock:
                    for worker in list(self._workers()):
                        self._check(worker)
        except Exception as exc:  # noqa: BLE001 - never leave a job waiting forever
            with self._lock:
                self._closed.set()
                for job in [*self._queue, *(w.job for w in self._workers() if w.job)]:
                    self._finish(job, None, f"pool supervisor failed: {exc!r}")
                self._queue.clear()

    def _stop_supervising(self) -> bool:
        """Mark the pool closed and wait for the supervisor; False if it already was."""
        with self._lock:
            if self._closed.is_set():
                return False
            self._closed.set()
        self._thread.join()
        return True

    def _fail_queued(self, reason: str) -> None:
        while self._queue:
            self._finish(self._queue.popleft(), None, reason)

    def submit(self, task: Task, candidate: str | Path, _debug_sleep_s: float = 0.0
               ) -> JobHandle:
        raise NotImplementedError

    def _enqueue(self, task: Task, candidate: Any, debug_sleep_s: float,
                 problem: str | None = None) -> JobHandle:
        """Queue a job (or end it at once with ``problem``); call with ``_lock`` held."""
        if self._closed.is_set():
            raise RuntimeError("the pool is closed")
        self._next_id += 1
        message = {"id": self._next_id, "task": task.model_dump(), "candidate": candidate,
                   "_debug_sleep_s": debug_sleep_s}
        job = Job(self._next_id, task.name, message, Future())
        if problem is None:
            self._queue.append(job)
        else:
            self._finish(job, None, problem)
        return JobHandle(job)

    def map(self, jobs: Iterable[tuple[Task, str | Path]], timeout: float | None = None
            ) -> list[JudgeResult | JobFailed]:
        """Judge every (task, candidate) pair; results in the order given."""
        handles = [self.submit(task, candidate) for task, candidate in jobs]
        return [h.result(timeout) for h in handles]

    def stats(self) -> PoolStats:
        with self._lock:
            workers = self._workers()
            running = sum(w.job is not None for w in workers)
            return PoolStats(len(workers), len(self._queue), running, self._done,
                             self._failed, self._replaced)

    def _retry_or_fail(self, job: Job, reason: str) -> None:
        """Put the job of a replaced worker back at the front, or fail it for good."""
        job.pid = None
        if job.attempts <= self.config.retries:
            self._queue.appendleft(job)
        else:
            self._finish(job, None, f"{reason} (after {job.attempts} attempts)")

    def _finish(self, job: Job, result: JudgeResult | None, reason: str | None) -> None:
        job.pid = None
        if job.future.done():
            return
        if result is not None:
            self._done += 1
            job.future.set_result(result)
        else:
            self._failed += 1
            job.future.set_result(JobFailed(job.task, reason or "", job.attempts))


@runtime_checkable
class JudgeBackend(Protocol):
    """A pool of judges behind one queue: ``JudgePool`` or ``RayJudgePool``."""

    def submit(self, task: Task, candidate: str | Path) -> JobHandle:
        """Queue judging ``candidate`` (a workspace, a .py file or ``builtin:NAME``)."""
        ...

    def map(self, jobs: Iterable[tuple[Task, str | Path]], timeout: float | None = None
            ) -> list[JudgeResult | JobFailed]:
        """Judge every (task, candidate) pair; results in the order given."""
        ...

    def stats(self) -> PoolStats: ...

    def close(self) -> None:
        """Stop the workers; unfinished jobs end as ``JobFailed('pool closed')``."""
        ...

    def __enter__(self) -> JudgeBackend: ...

    def __exit__(self, *exc: object) -> None: ...


def make_pool(config: PoolConfig | None = None) -> JudgeBackend:
    """The pool ``config.backend`` names; the Ray one joins ``config.ray_address``."""
    from cuda_agent.execution.pool import JudgePool, PoolConfig

    config = config or PoolConfig()
    if config.backend == "ray":
        from cuda_agent.execution.pool_ray import RayJudgePool

        return RayJudgePool(config)
    return JudgePool(config)


def judge_result(data: dict[str, Any]) -> JudgeResult:
    """Rebuild a ``JudgeResult`` from its ``to_dict`` form."""
    fields = dict(data)
    if fields.get("build"):
        fields["build"] = BuildResult.from_dict(fields["build"])
    if fields.get("correctness"):
        found = fields["correctness"]
        fields["correctness"] = CorrectnessResult(**{**found, "reasons": tuple(found["reasons"])})
    for key in ("timing", "eager_timing", "compile_timing"):
        if fields.get(key):
            fields[key] = TimingStats(**fields[key])
    for key in ("reasons", "flags"):
        fields[key] = tuple(fields.get(key, ()))
    fields["phases"] = tuple(tuple(p) for p in fields.get("phases", ()))
    fields["size"] = tuple(SizeChange(**c) for c in fields.get("size", ()))
    fields["baselines"] = tuple(
        BaselineSource(**{**b, "check": TimingStats(**b["check"]) if b.get("check") else None})
        for b in fields.get("baselines", ()))
    fields["shapes"] = tuple(ShapeResult(**{**s, "reasons": tuple(s.get("reasons", ()))})
                             for s in fields.get("shapes", ()))
    return JudgeResult(**fields)
