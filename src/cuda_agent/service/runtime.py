"""The running service: episodes, tools, metrics and the threads that run tool calls.

Nothing starts when a ``Service`` is made; ``lifespan`` (the app's start and stop) creates
the episode folder, the sandbox and the idle reaper, and on the way out closes every
episode and the judge queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from fastapi import FastAPI

from cuda_agent.service.config import ServiceConfig
from cuda_agent.service.episodes import Episode, EpisodeManager
from cuda_agent.service.errors import ApiError
from cuda_agent.service.metrics import Metrics
from cuda_agent.service.sources import TaskSources
from cuda_agent.service.tools import Toolbox

T = TypeVar("T")
log = logging.getLogger("cuda_agent.service")


def resolve_device(device: str) -> str:
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


class Service:
    """Everything one app serves with; shared by all requests."""

    def __init__(self, config: ServiceConfig):
        self.config = config
        self.device = resolve_device(config.device)
        self.metrics = Metrics()
        self.episodes = EpisodeManager(
            config.episodes_root(), TaskSources(config.task_roots, config.allow_builtin),
            self.device, config.max_episodes, config.busy_timeout_s)
        self.tools = Toolbox(config, self.device)
        self._executor: ThreadPoolExecutor | None = None

    @contextlib.asynccontextmanager
    async def lifespan(self, _app: FastAPI) -> AsyncIterator[None]:
        self.episodes.root.mkdir(parents=True, exist_ok=True)
        self.episodes.root.chmod(0o700)
        self.episodes.remove_leftovers()
        self.tools.start()
        self._executor = ThreadPoolExecutor(self.config.threads(), "cuda-agent-tool")
        reaper = asyncio.create_task(self._reap_forever())
        try:
            yield
        finally:
            reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reaper
            executor, self._executor = self._executor, None
            await asyncio.get_running_loop().run_in_executor(None, self._shutdown)
            executor.shutdown(wait=False, cancel_futures=True)

    def _shutdown(self) -> None:
        self.tools.close()
        self.episodes.close_all()

    async def _reap_forever(self) -> None:
        interval = max(0.05, min(30.0, self.config.idle_timeout_s / 4))
        while True:
            await asyncio.sleep(interval)
            try:
                await self.run("reap", lambda: self.episodes.reap(self.config.idle_timeout_s),
                               record=False)
            except Exception:  # noqa: BLE001 - the reaper must outlive one bad pass
                log.exception("reaping idle episodes failed")

    async def run(self, tool: str, fn: Callable[[], T], record: bool = True) -> T:
        """Run ``fn`` on a tool thread; 504 when it outlasts ``tool_timeout_s`` (it goes on
        running to its end, so a judgement under way is still kept)."""
        if self._executor is None:
            raise ApiError(503, "the service is not running")
        start = time.perf_counter()
        status = 200
        try:
            future = asyncio.get_running_loop().run_in_executor(self._executor, fn)
            return await asyncio.wait_for(asyncio.shield(future), self.config.tool_timeout_s)
        except asyncio.TimeoutError:
            status = 504
            raise ApiError(504, f"{tool} did not finish within {self.config.tool_timeout_s:g} "
                           "s; it goes on, and a judgement will still be kept (see /reward)"
                           ) from None
        except ApiError as exc:
            status = exc.status
            raise
        except BaseException:
            status = 500
            raise
        finally:
            if record:
                self.metrics.record(tool, time.perf_counter() - start, status)

    async def on_episode(self, tool: str, owner: str, handle: str,
                         fn: Callable[[Episode], T]) -> T:
        """Run one tool call on ``owner``'s episode named ``handle``, holding its lock."""
        def call() -> T:
            with self.episodes.use(owner, handle) as episode:
                return fn(episode)

        return await self.run(tool, call)

    def snapshot(self) -> dict[str, Any]:
        """The numbers ``/metrics`` reports."""
        manager = self.episodes
        pool = self.tools.pool_stats()
        return {
            "episodes": {"open": manager.open_count(), "max": manager.max_episodes,
                         "opened_total": manager.opened_total,
                         "closed_total": manager.closed_total,
                         "expired_total": manager.expired_total},
            "tools": self.metrics.tools(),
            "judge_jobs": {
                "waiting_calls": self.tools.judge_running,
                "queued": pool.queued if pool else 0, "running": pool.running if pool else 0,
                "done": pool.done if pool else 0, "failed": pool.failed if pool else 0,
                "workers": pool.workers if pool else 0,
                "replaced": pool.replaced if pool else 0},
        }
