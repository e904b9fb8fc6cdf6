"""The judge pool on a Ray cluster: one actor per GPU, fed from one queue (docs/pool.md).

    from cuda_agent.execution import PoolConfig, RayJudgePool
    with RayJudgePool(PoolConfig(), ray_address="auto") as pool:   # a running cluster
        results = pool.map([(task, "ws/a"), (task, "ws/b")])

Each actor asks Ray for one GPU (``num_gpus=1``, so Ray gives it that GPU alone) or, on the
CPU, one core, and owns a ``Judge(keep_warm=True)``. A dispatcher thread hands a job only to
an idle actor, and replaces an actor that dies, overruns ``job_timeout_s`` or reports a
failed CUDA context, retrying its job up to ``retries`` times. Tasks travel as
``Task.model_dump()``, candidates as their file contents, so the trainer and the judges
need share no filesystem. Needs the optional extra ``[ray]``.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path
from typing import Any

from cuda_agent.execution.backend import Job, JobHandle, PoolBase, judge_result
from cuda_agent.execution.pool import PoolConfig
from cuda_agent.execution.pool_ray_actor import JudgeActor, pack_candidate
from cuda_agent.judge.candidate import CandidateError
from cuda_agent.tasks.task import Task

_STOP_WAIT_S = 2.0
"""How long a hung actor gets to kill its judge's processes before it is killed itself."""


class _Actor:
    """One judge actor and the job it holds."""

    def __init__(self, remote_class: Any, device: str, judge: dict[str, Any]):
        resources = {"num_gpus": 1} if device == "cuda" else {"num_cpus": 1}
        self.device = device
        # two calls at once: ``stop_tree`` must run beside a hung ``serve``
        self.handle = remote_class.options(max_concurrency=2, **resources).remote(judge, device)
        self.ready_ref = self.handle.pid.remote()
        self.started = time.monotonic()
        self.pid: int | None = None
        self.job: Job | None = None
        self.job_ref: Any = None
        self.since = 0.0

    def kill(self, ray: Any, stop_tree: bool) -> None:
        """Kill the actor; first its judge's processes when it can still answer."""
        if stop_tree:
            with contextlib.suppress(Exception):  # the actor is killed below in any case
                ray.wait([self.handle.stop_tree.remote()], timeout=_STOP_WAIT_S)
        ray.kill(self.handle, no_restart=True)


class RayJudgePool(PoolBase):
    """Judge actors on a Ray cluster behind one queue; a context manager, or call ``close()``.

    ``ray_address`` (else ``config.ray_address``): None starts a Ray instance on this
    machine, or reuses the one this process has already joined; 'auto' or 'ray://HOST:10001'
    joins a running cluster. ``close()`` shuts Ray down only if this pool started it.
    """

    def __init__(self, config: PoolConfig | None = None, ray_address: str | None = None):
        import ray

        self._ray = ray
        self.config = config or PoolConfig()
        if self.config.jobs_per_gpu != 1:
            raise ValueError("jobs_per_gpu is a local-pool setting: the Ray backend runs one "
                             "judge per GPU actor (num_gpus=1)")
        self._owns_ray = _join(ray, ray_address or self.config.ray_address, self.config)
        try:
            devices = self._places()
        except Exception:
            if self._owns_ray:
                ray.shutdown()
            raise
        self._remote = ray.remote(JudgeActor)
        self._init_queue()
        self._actors = [_Actor(self._remote, device, self._judge) for device in devices]
        self._thread = threading.Thread(target=self._supervise, name="ray-judge-pool",
                                        daemon=True)
        self._thread.start()

    def _places(self) -> list[str]:
        """The device of each actor: 'cuda' once per GPU, else 'cpu' per CPU worker."""
        gpus, device = self.config.gpus, self.config.judge.device
        if device == "cpu":
            count = 0
        elif gpus is None:
            count = int(self._ray.cluster_resources().get("GPU", 0))
        else:
            count = len(gpus)  # Ray picks which GPUs; only the number is used
        if device == "cuda" and count == 0:
            raise ValueError("judge.device is 'cuda' but the Ray pool has no GPU")
        return ["cuda"] * count if count else ["cpu"] * self.config.cpu_workers

    def submit(self, task: Task, candidate: str | Path, _debug_sleep_s: float = 0.0
               ) -> JobHandle:
        """Queue judging ``candidate`` (a workspace, a .py file or ``builtin:NAME``).

        The candidate's files are read now, so later changes to it do not count; one that
        cannot be shipped ends at once as ``JobFailed('candidate not shipped: ...')``.
        ``_debug_sleep_s`` makes the actor sleep before judging: for tests of hung workers.
        """
        try:
            shipped, problem = pack_candidate(candidate), None
        except (CandidateError, OSError) as exc:
            shipped, problem = {}, f"candidate not shipped: {exc}"
        with self._lock:
            return self._enqueue(task, shipped, _debug_sleep_s, problem)

    def _workers(self) -> list[_Actor]:
        return self._actors

    def worker_pids(self) -> list[int]:
        """Process ids of the ready actors (on whichever machine each runs)."""
        with self._lock:
            return [actor.pid for actor in self._actors if actor.pid is not None]

    def close(self) -> None:
        """Stop the actors; jobs not finished end as ``JobFailed('pool closed')``."""
        if not self._stop_supervising():
            return
        ray = self._ray
        with self._lock:
            busy = [a for a in self._actors if a.job is not None]
            for actor in busy:
                self._finish(actor.job, None, "pool closed")
            idle = [a for a in self._actors if a.job is None and a.pid is not None]
            if idle:
                ray.wait([a.handle.close.remote() for a in idle], num_returns=len(idle),
                         timeout=10.0)
            for actor in self._actors:
                actor.kill(ray, stop_tree=actor in busy)
            self._fail_queued("pool closed")
        if self._owns_ray:
            ray.shutdown()

    def _wait_for_events(self) -> None:
        with self._lock:
            refs = [a.job_ref if a.pid is not None else a.ready_ref
                    for a in self._actors if a.pid is None or a.job is not None]
        if refs:
            self._ray.wait(refs, num_returns=1, timeout=0.1)
        else:
            self._closed.wait(0.1)

    def _dispatch(self) -> None:
        for actor in self._actors:
            if not self._queue:
                return
            if actor.pid is not None and actor.job is None:
                job = self._queue.popleft()
                job.attempts += 1
                job.pid, actor.job, actor.since = actor.pid, job, time.monotonic()
                actor.job_ref = actor.handle.serve.remote(job.message)

    def _check(self, actor: _Actor) -> None:
        ray, now = self._ray, time.monotonic()
        if actor.pid is None:
            if ray.wait([actor.ready_ref], timeout=0)[0]:
                try:
                    actor.pid = ray.get(actor.ready_ref)
                except Exception as exc:  # noqa: BLE001 - any start failure replaces it
                    self._replace(actor, f"worker failed to start: {_brief(exc)}", False)
            elif now - actor.started > self.config.start_timeout_s:
                self._replace(actor, f"worker not ready after "
                              f"{self.config.start_timeout_s:g} s", True)
            return
        if actor.job is None:
            return
        if ray.wait([actor.job_ref], timeout=0)[0]:
            try:
                reply = ray.get(actor.job_ref)
            except Exception as exc:  # noqa: BLE001 - ActorDiedError and the like
                self._replace(actor, f"worker died: {_brief(exc)}", False)
                return
            self._receive(actor, reply)
        elif now - actor.since > self.config.job_timeout_s:
            self._replace(actor, f"worker hung: no result after "
                          f"{self.config.job_timeout_s:g} s", True)

    def _receive(self, actor: _Actor, reply: dict[str, Any]) -> None:
        job = actor.job
        assert job is not None
        if job.id != reply.get("id"):
            self._replace(actor, "worker answered a job it was not given", True)
        elif reply.get("poisoned"):
            reason = f"worker CUDA context failed: {reply.get('reason', '')[:300]}"
            self._replace(actor, reason, True)
        else:
            actor.job = actor.job_ref = None
            if reply["ok"]:
                self._finish(job, judge_result(reply["result"]), None)
            else:
                self._finish(job, None, reply.get("reason", "unknown failure"))

    def _replace(self, actor: _Actor, reason: str, stop_tree: bool) -> None:
        actor.kill(self._ray, stop_tree)
        self._replaced += 1
        self._actors[self._actors.index(actor)] = _Actor(self._remote, actor.device,
                                                         self._judge)
        job = actor.job
        if job is None:
            return
        self._retry_or_fail(job, reason)


def _join(ray: Any, address: str | None, config: PoolConfig) -> bool:
    """Connect this process to Ray; True when it started a local instance it must stop."""
    if ray.is_initialized():
        return False
    if address is not None:
        ray.init(address=address)
        return False
    # a new local instance: Ray turns token authentication on and says so once, unless
    # RAY_AUTH_MODE was set before ray was imported
    ray.init(num_cpus=max(os.cpu_count() or 1, config.cpu_workers), include_dashboard=False,
             logging_level="WARNING")
    return True


def _brief(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]
