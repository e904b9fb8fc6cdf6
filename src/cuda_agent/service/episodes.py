"""Episodes: one task, one fresh workspace, one unguessable handle, one call at a time.

The handle is ``secrets.token_urlsafe(32)``; the service keeps only its SHA-256, and the
workspace folder has a separate random name, so neither a listing nor a log reveals a
handle. Every tool call holds the episode's lock; different episodes run concurrently.
Judgements stay with the episode until it is closed (or closed for being idle).
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import secrets
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from cuda_agent.judge.cpu_size import workspace_sizing
from cuda_agent.results import JudgeResult
from cuda_agent.service.errors import ApiError, bad_request, not_found
from cuda_agent.service.files import text_files
from cuda_agent.service.sources import TaskSources
from cuda_agent.tasks import Task, TaskError
from cuda_agent.tasks.inspect import TaskSpec, inspect_task
from cuda_agent.workspace import WorkspaceError, init_workspace
from cuda_agent.workspace.init import META_DIR, store_task


@dataclasses.dataclass(frozen=True)
class Judgement:
    """One finished judge call of an episode: a verdict, or the reason there was none."""

    id: int
    reward: int | None
    result: JudgeResult | None
    failure: str | None
    seconds: float


@dataclasses.dataclass(eq=False)
class Episode:
    """An open episode; mutable state is only touched while ``lock`` is held."""

    id: str
    task: Task
    device: str
    folder: Path
    root: Path
    baseline: dict[str, str]
    opened: float
    last_used: float
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    judgements: list[Judgement] = dataclasses.field(default_factory=list)
    closed: bool = False
    warm: Any = None
    """The episode's warm judge (``execution.warm_judge``), from its first verify or profile."""


_FOLDER = re.compile(r"[0-9a-f]{24}")


def _key(owner: str, handle: str) -> str:
    """Episodes are found by owner and handle together: another key's handle is missing."""
    return hashlib.sha256(f"{owner}\0{handle}".encode("utf-8", "surrogatepass")).hexdigest()


class EpisodeManager:
    """Opens, finds, locks and closes episodes under one folder."""

    def __init__(self, root: Path, sources: TaskSources, device: str, max_episodes: int,
                 busy_timeout_s: float):
        self.root = root
        self.sources = sources
        self.device = device
        self.max_episodes = max_episodes
        self.busy_timeout_s = busy_timeout_s
        self._episodes: dict[str, Episode] = {}
        self._reserved = 0
        self._lock = threading.Lock()
        self._spec_lock = threading.Lock()
        self.opened_total = 0
        self.closed_total = 0
        self.expired_total = 0

    def open(self, owner: str, task_ref: str, device: str | None) -> tuple[str, Episode]:
        """Create the episode's workspace; returns its handle and the episode."""
        device = device or self.device
        if device != self.device:
            raise bad_request(f"this service runs episodes on {self.device!r}, not {device!r}")
        task = self.sources.resolve(task_ref)
        with self._lock:
            if len(self._episodes) + self._reserved >= self.max_episodes:
                raise ApiError(429, f"{self.max_episodes} episodes are open, the most this "
                               "service allows; close one first")
            self._reserved += 1
        try:
            episode = self._create(task, device)
        finally:
            with self._lock:
                self._reserved -= 1
        handle = secrets.token_urlsafe(32)
        with self._lock:
            self._episodes[_key(owner, handle)] = episode
            self.opened_total += 1
        return handle, episode

    def _create(self, task: Task, device: str) -> Episode:
        spec = self._spec(task)
        folder = self.root / secrets.token_hex(12)
        try:
            root = init_workspace(task, folder / "workspace", device, spec=spec,
                                  sizing=workspace_sizing(task, device))
        except WorkspaceError as exc:
            shutil.rmtree(folder, ignore_errors=True)
            raise ApiError(500, f"workspace could not be created: {exc}") from None
        now = time.monotonic()
        return Episode(folder.name, task, device, folder, root, text_files(root), now, now)

    def _spec(self, task: Task) -> TaskSpec:
        """Inspect the task (once per process: ``inspect_task`` keeps its specs) and store its
        trusted copy, one request at a time, before concurrent workspaces of it are made."""
        with self._spec_lock:
            try:
                spec = inspect_task(task)
            except TaskError as exc:
                raise bad_request(f"task {task.name}: {exc}") from None
            store_task(task)
            return spec

    def get(self, owner: str, handle: str) -> Episode:
        with self._lock:
            episode = self._episodes.get(_key(owner, handle))
        if episode is None:
            raise not_found()
        return episode

    @contextmanager
    def use(self, owner: str, handle: str) -> Iterator[Episode]:
        """Hold the episode's lock for one tool call (409 if it stays busy)."""
        episode = self.get(owner, handle)
        if not episode.lock.acquire(timeout=self.busy_timeout_s):
            raise ApiError(409, f"the episode is still busy with another call after "
                           f"{self.busy_timeout_s:g} s; calls on one episode run one at a time")
        try:
            if episode.closed:
                raise not_found()
            episode.last_used = time.monotonic()
            yield episode
            episode.last_used = time.monotonic()
        finally:
            episode.lock.release()

    def close(self, owner: str, handle: str) -> Episode:
        """Forget the episode and delete its workspace (waits for a call under way)."""
        with self.use(owner, handle) as episode:
            with self._lock:
                self._episodes.pop(_key(owner, handle), None)
                self.closed_total += 1
            self._discard(episode)
        return episode

    def reap(self, idle_timeout_s: float) -> int:
        """Close the episodes idle for longer than ``idle_timeout_s``; returns how many."""
        now = time.monotonic()
        with self._lock:
            stale = [(k, e) for k, e in self._episodes.items()
                     if now - e.last_used > idle_timeout_s]
        count = 0
        for key, episode in stale:
            if not episode.lock.acquire(blocking=False):
                continue  # a call is under way: not idle
            try:
                if now - episode.last_used <= idle_timeout_s or episode.closed:
                    continue
                with self._lock:
                    self._episodes.pop(key, None)
                    self.expired_total += 1
                self._discard(episode)
                count += 1
            finally:
                episode.lock.release()
        return count

    def close_all(self) -> None:
        with self._lock:
            episodes = list(self._episodes.values())
            self._episodes.clear()
        for episode in episodes:
            held = episode.lock.acquire(timeout=5.0)
            try:
                self._discard(episode)
            finally:
                if held:
                    episode.lock.release()

    def remove_leftovers(self) -> int:
        """Delete the workspaces a previous run of the service left (episodes do not
        survive a restart); returns how many."""
        count = 0
        for folder in self.root.iterdir():
            if _FOLDER.fullmatch(folder.name) and (folder / "workspace" / META_DIR).is_dir():
                shutil.rmtree(folder, ignore_errors=True)
                count += 1
        return count

    def open_count(self) -> int:
        with self._lock:
            return len(self._episodes)

    @staticmethod
    def _discard(episode: Episode) -> None:
        episode.closed = True
        if episode.warm is not None:
            episode.warm.close()
            episode.warm = None
        shutil.rmtree(episode.folder, ignore_errors=True)
