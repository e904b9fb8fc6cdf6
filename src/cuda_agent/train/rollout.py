"""Rollouts: run the agent on a task set, K episodes at once, and keep every trajectory.

    cuda-agent rollout builtin:gelu_bias_scale --model replay:builtin --out runs/r0 \\
        --episodes-per-task 4 --parallel 2 --device cpu

``OUT/`` holds ``workspaces/<task>-<k>/`` (each episode's own workspace),
``trajectories/<task>-<k>.jsonl`` and the manifest ``rollouts.jsonl``: one line per finished
episode (task, k, reward, stop_reason, path relative to OUT, seconds, error), fsynced as it
is written. A rerun with the same OUT skips every (task, k) already in the manifest; an
episode killed half-way is not in it, so its workspace and trajectory are started afresh.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from cuda_agent.agent.loop import AgentConfig, run_episode
from cuda_agent.agent.types import Policy
from cuda_agent.tasks.task import Task

MANIFEST = "rollouts.jsonl"


class RolloutConfig(BaseModel):
    """How many episodes, how many at once, where they run; ``rollout:`` in the YAML."""

    episodes_per_task: int = Field(1, ge=1, description="Episodes per task (k = 0..N-1).")
    parallel: int = Field(1, ge=1, description="Episodes run at once (threads).")
    device: str = Field("cpu", description="Workspace device: 'cpu' or 'cuda'.")
    agent: AgentConfig = Field(default_factory=AgentConfig,
                               description="Limits, tools and final judgement of each episode.")


@dataclasses.dataclass(frozen=True)
class RolloutRecord:
    """One finished episode, as written to the manifest."""

    task: str
    k: int
    reward: float | None
    stop_reason: str
    path: str
    """Trajectory path relative to OUT."""
    seconds: float = 0.0
    error: str | None = None


@dataclasses.dataclass(frozen=True)
class RolloutSummary:
    """What one ``collect`` call did: the episodes it ran, and how many it skipped."""

    finished: list[RolloutRecord]
    skipped: int
    failed: dict[str, str]
    """``<task>-<k>`` -> error, for episodes that raised before an episode_end was written."""


PolicyFactory = Callable[[Task], Policy]


def episode_name(task: str, k: int) -> str:
    """``<task>-<k>`` with anything but letters, digits, '_', '.', '-' replaced by '_'."""
    return f"{re.sub(r'[^A-Za-z0-9_.-]', '_', task)}-{k}"


def read_manifest(out: Path) -> list[RolloutRecord]:
    """The manifest's records; a torn last line (a killed writer) is ignored."""
    path = Path(out) / MANIFEST
    if not path.exists():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            data = json.loads(line)
            records.append(RolloutRecord(**data))
        except (ValueError, TypeError):
            continue
    return records


def pending(tasks: Iterable[Task], episodes_per_task: int, out: Path
            ) -> tuple[list[tuple[Task, int]], int]:
    """Episodes still to run, and how many the manifest already has."""
    done = {(r.task, r.k) for r in read_manifest(out)}
    todo, skipped = [], 0
    for task in tasks:
        for k in range(episodes_per_task):
            if (task.name, k) in done:
                skipped += 1
            else:
                todo.append((task, k))
    return todo, skipped


class _Manifest:
    def __init__(self, out: Path):
        self.path = Path(out) / MANIFEST
        self.lock = threading.Lock()
        if self.path.exists() and self.path.stat().st_size:
            with self.path.open("rb+") as handle:
                handle.seek(-1, os.SEEK_END)
                if handle.read(1) != b"\n":  # a torn last line: end it so ours start clean
                    handle.write(b"\n")

    def append(self, record: RolloutRecord) -> None:
        line = json.dumps(dataclasses.asdict(record)) + "\n"
        with self.lock, self.path.open("a", encoding="utf-8") as handle:
            handle.write(line)
            handle.flush()
            os.fsync(handle.fileno())


def run_one(task: Task, k: int, policy: Policy, out: Path, config: RolloutConfig
            ) -> RolloutRecord:
    """One episode in a fresh workspace; whatever a killed earlier try left is removed."""
    from cuda_agent.judge.cpu_size import workspace_sizing
    from cuda_agent.workspace import init_workspace

    name = episode_name(task.name, k)
    workspace = out / "workspaces" / name
    trajectory = out / "trajectories" / f"{name}.jsonl"
    if workspace.exists():
        shutil.rmtree(workspace)
    trajectory.unlink(missing_ok=True)
    root = init_workspace(task, workspace, config.device,
                          sizing=workspace_sizing(task, config.device))
    result = run_episode(task, root, policy, config.agent, trajectory)
    return RolloutRecord(task=task.name, k=k, reward=result.reward,
                         stop_reason=result.stop_reason,
                         path=str(trajectory.relative_to(out)),
                         seconds=round(result.seconds, 3), error=result.error)


def collect(tasks: Iterable[Task], make_policy: PolicyFactory, out: Path,
            config: RolloutConfig | None = None,
            on_start: Callable[[int, int], Any] | None = None,
            on_done: Callable[[RolloutRecord | None], Any] | None = None) -> RolloutSummary:
    """Run every pending episode, ``config.parallel`` at once; see the module docstring.

    ``make_policy(task)`` is called once per episode (it may return a shared policy; a
    replay must be fresh per episode, it keeps its position). ``on_start(pending, skipped)``
    is called once, ``on_done(record)`` after each episode (None for one that raised).
    """
    config = config or RolloutConfig()
    out = Path(out).resolve()
    (out / "trajectories").mkdir(parents=True, exist_ok=True)
    (out / "workspaces").mkdir(parents=True, exist_ok=True)
    todo, skipped = pending(tasks, config.episodes_per_task, out)
    if on_start is not None:
        on_start(len(todo), skipped)
    manifest = _Manifest(out)
    finished: list[RolloutRecord] = []
    failed: dict[str, str] = {}

    def work(task: Task, k: int) -> RolloutRecord:
        record = run_one(task, k, make_policy(task), out, config)
        manifest.append(record)
        return record

    with ThreadPoolExecutor(max_workers=config.parallel, thread_name_prefix="rollout") as pool:
        futures = {pool.submit(work, task, k): episode_name(task.name, k) for task, k in todo}
        try:
            for future in as_completed(futures):
                try:
                    record: RolloutRecord | None = future.result()
                except Exception as exc:
                    failed[futures[future]] = f"{type(exc).__name__}: {exc}"
                    record = None
                else:
                    finished.append(record)
                if on_done is not None:
                    on_done(record)
        except BaseException:
            for future in futures:
                future.cancel()
            raise
    return RolloutSummary(finished, skipped, failed)
