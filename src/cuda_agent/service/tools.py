"""The episode tools that run code: shell (sandbox), build, verify, profile and judge.

``judge`` goes through the judge queue, so judgements (and their timings) never share a
GPU; the queue is made on the first judge call, by ``_make_pool``, the one place where the
backend is chosen. ``verify`` and ``profile`` run a judge in this process, at most
``max_local_judges`` at once. Callers hold the episode's lock.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from pathlib import Path
from typing import Protocol

from cuda_agent.build import Builder
from cuda_agent.execution.backend import JobFailed, PoolStats
from cuda_agent.execution.pool import JudgePool, PoolConfig
from cuda_agent.execution.sandbox import (
    CommandResult,
    Sandbox,
    SandboxUnavailable,
    make_sandbox,
)
from cuda_agent.execution.warm_judge import (
    ENV,
    WarmJudge,
    WarmJudgeError,
    address,
    reaches_judge,
)
from cuda_agent.judge.config import in_episode
from cuda_agent.results import BuildResult, JudgeResult
from cuda_agent.service.config import ServiceConfig
from cuda_agent.service.episodes import Episode, Judgement
from cuda_agent.service.errors import ApiError
from cuda_agent.tasks import Task


class JudgeJob(Protocol):
    """A queued judgement."""

    def result(self, timeout: float | None = None) -> JudgeResult | JobFailed: ...


class JudgeQueue(Protocol):
    """What the service needs of a judge backend (``JudgePool`` or another)."""

    def submit(self, task: Task, candidate: str | Path) -> JudgeJob: ...

    def stats(self) -> PoolStats: ...

    def close(self) -> None: ...


def _make_pool(config: PoolConfig) -> JudgeQueue:
    """The judge backend of the service: the local process pool, one worker per GPU."""
    return JudgePool(config)


class Toolbox:
    """Runs the tools of every episode; owns the sandbox, the builder and the judge queue."""

    def __init__(self, config: ServiceConfig, device: str):
        self.config = config
        self.device = device
        self.builder = Builder(config.judge.build.model_copy(update={"device": device}))
        self._sandbox: Sandbox | None = None
        self._local = threading.BoundedSemaphore(config.max_local_judges)
        self._pool: JudgeQueue | None = None
        self._pool_lock = threading.Lock()
        self._closed = False
        self._ids = itertools.count(1)
        self.judged = self.judge_failed = self.judge_running = 0
        self._count_lock = threading.Lock()

    def start(self) -> None:
        """Make the sandbox now, so a service that cannot confine commands fails at start."""
        self._sandbox = make_sandbox(self.config.sandbox)

    def shell(self, episode: Episode, command: str, timeout_s: float | None) -> CommandResult:
        limit = self.config.sandbox.timeout_s
        if reaches_judge(command):  # the shell's utils/verify reaches the episode's judge
            warm = self._warm(episode, wait=True)
            with contextlib.suppress(WarmJudgeError):
                warm.ensure(wait=True)  # listening before the command looks for it
        socket = address(episode.root)
        sandbox_config = self.config.sandbox.model_copy(update={
            "timeout_s": min(timeout_s or limit, limit),
            "env_set": {**self.config.sandbox.env_set, ENV: str(socket)},
            "ro_paths": (*self.config.sandbox.ro_paths, str(socket.parent))})
        if self._sandbox is None:
            try:
                self._sandbox = make_sandbox(self.config.sandbox)
            except SandboxUnavailable as exc:
                raise ApiError(503, f"sandbox unavailable: {exc}") from None
        return self._sandbox.run(command, episode.root, sandbox_config)

    def build(self, episode: Episode) -> BuildResult:
        return self.builder.build(episode.root, publish=True)

    def verify(self, episode: Episode) -> JudgeResult:
        return self._judge_here(episode, time=False, profile=False)

    def profile(self, episode: Episode) -> JudgeResult:
        return self._judge_here(episode, time=True, profile=True)

    def _judge_here(self, episode: Episode, time: bool, profile: bool) -> JudgeResult:
        """Through the episode's warm judge (docs/warm-judge.md), ended with the episode."""
        with self._local:
            try:
                return self._warm(episode).call("profile" if time else "verify")
            except WarmJudgeError as exc:
                raise ApiError(503, f"no verdict could be made: {exc}") from None

    def _warm(self, episode: Episode, wait: bool = True) -> WarmJudge:
        """The episode's warm judge, started at its first verify or profile call or shell
        command that may reach it (``reaches_judge``)."""
        if episode.warm is None:
            configs = {op: in_episode(self.config.judge).model_copy(update={
                "device": episode.device, "time": op == "profile", "keep_warm": True})
                for op in ("verify", "profile")}
            episode.warm = WarmJudge(episode.root, configs, owner=True, task=episode.task)
            with contextlib.suppress(WarmJudgeError):
                episode.warm.start(wait=wait)  # a call that needs it says why not
        return episode.warm

    def judge(self, episode: Episode) -> Judgement:
        """Queue the workspace for the judge, wait for the verdict and keep it."""
        start = time.monotonic()
        if episode.warm is not None:  # nothing the agent started may run beside the verdict
            episode.warm.close()
            episode.warm = None
        pool = self.pool()
        try:
            job = pool.submit(episode.task, episode.root)
        except RuntimeError as exc:
            raise ApiError(503, f"the judge queue is not accepting jobs: {exc}") from None
        with self._count_lock:
            self.judge_running += 1
        try:
            outcome = job.result()
        finally:
            with self._count_lock:
                self.judge_running -= 1
        seconds = time.monotonic() - start
        if isinstance(outcome, JobFailed):
            record = Judgement(next(self._ids), None, None, outcome.reason, seconds)
        else:
            record = Judgement(next(self._ids), outcome.reward, outcome, None, seconds)
        with self._count_lock:
            self.judged += record.result is not None
            self.judge_failed += record.result is None
        episode.judgements.append(record)
        return record

    def pool(self) -> JudgeQueue:
        with self._pool_lock:
            if self._closed:
                raise ApiError(503, "the service is shutting down")
            if self._pool is None:
                config = self.config.pool
                judge = config.judge.model_copy(update={"device": self.device})
                self._pool = _make_pool(config.model_copy(update={"judge": judge}))
            return self._pool

    def pool_stats(self) -> PoolStats | None:
        with self._pool_lock:
            return self._pool.stats() if self._pool is not None else None

    def close(self) -> None:
        with self._pool_lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()
