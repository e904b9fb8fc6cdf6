"""Measure a task's eager and torch.compile baselines the way the judge does, and cache them.

    from cuda_agent.judge.measure import measure_baselines
    measured = measure_baselines(task, JudgeConfig(device="cuda"))

The reference and the compile baseline run in fresh worker processes with the judge's own
jobs, timing settings and cache key, so a later judgement of the same task on the same
device (and settings) reads the figures from the cache instead of timing them again.

Several processes may measure on one GPU when they share ``JudgeConfig.gpu_lock``: each
holds the GPU's turn shared through a worker's first call (for torch.compile, the
compilation) and exclusive through its stand-ins and timing (``gpu_turn``), so timings stay
exclusive while compilations overlap.
"""

from __future__ import annotations

import secrets
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from cuda_agent.judge.baselines import Baselines
from cuda_agent.judge.config import JudgeConfig
from cuda_agent.judge.cpu_size import judged_task
from cuda_agent.judge.judge import Judge
from cuda_agent.judge.plan import JudgePlan
from cuda_agent.judge.recheck import measure_fresh
from cuda_agent.tasks.shapes import shape_tasks
from cuda_agent.tasks.task import Task


@dataclass(frozen=True)
class MeasuredBaselines:
    """A task's baselines and where they came from."""

    baselines: Baselines
    cached: bool
    """True when read from the cache, False when measured now (and stored)."""
    key: str
    """The judge's baseline cache key (task, device, torch, precision, judge version, timing)."""
    device: str
    seconds: float


def measure_baselines(task: Task, config: JudgeConfig | None = None, refresh: bool = False
                      ) -> MeasuredBaselines:
    """The judge's baselines of ``task``: from the cache, else measured now and stored.

    ``refresh`` measures even when cached. Raises ``JudgeError`` when the reference or the
    torch.compile baseline fails (the judge could not judge the task either).
    """
    # the baselines are timings: no outputs are checked (the cache key does not depend on it)
    config = (config or JudgeConfig()).model_copy(update={"confine": "off", "check": False})
    if not config.time:
        raise ValueError("baselines are timings: JudgeConfig.time must be on")
    start = time.perf_counter()
    seed = config.seed if config.seed is not None else secrets.randbits(128)
    with Judge(config) as judge, tempfile.TemporaryDirectory(prefix="cuda-agent-base-") as tmp:
        task = judged_task(task, config, judge.device)[0]  # the size the judge runs it at
        plan = JudgePlan(config, task, judge.device, seed, Path(tmp))
        cached = None if refresh else plan.cached_baselines()
        if cached is not None:
            return MeasuredBaselines(cached, True, plan.baseline_key, judge.device,
                                     time.perf_counter() - start)
        base = measure_fresh(plan, judge._worker, judge._timer(), judge._turn)
    return MeasuredBaselines(base, False, plan.baseline_key, judge.device,
                             time.perf_counter() - start)


def measure_ahead(judge: Judge, task: Task) -> int:
    """Measure now the baselines ``judge``'s timed judgements of ``task`` will look for (at
    each of its shapes), so that its first one finds them; kept where those look: the
    shared cache where the judge stores baselines, else the judge's own. Returns how many it
    measured. Judges sharing a GPU measure one at a time (``GpuTurn.first_to_measure``), so
    a judgement of another judge that asks meanwhile waits for these and then finds them."""
    cfg = judge.config
    if not (cfg.time and cfg.cache_baselines):
        return 0
    measured = 0
    variants = shape_tasks(task) or [("", task)]
    for name, shaped in variants:
        if cfg.shape is not None and name != cfg.shape:
            continue
        seed = cfg.seed if cfg.seed is not None else secrets.randbits(128)
        shaped = judged_task(shaped, cfg, judge.device)[0]  # the size the judge runs it at
        with tempfile.TemporaryDirectory(prefix="cuda-agent-base-") as tmp:
            plan = JudgePlan(cfg.model_copy(update={"check": False}), shaped, judge.device,
                             seed, Path(tmp))
            if judge._cached(plan) is not None:
                continue
            with judge._turn.first_to_measure():
                if judge._cached(plan) is not None:
                    continue
                base = measure_fresh(plan, judge._worker, judge._timer(), judge._turn)
            if not cfg.store_baselines:
                judge._baselines[plan.baseline_key] = base
            measured += 1
    return measured


def baseline_key(task: Task, config: JudgeConfig, device: str) -> str:
    """The cache key the judge uses for ``task``'s baselines on ``device`` (resolved), at
    the size it judges the task at there (``cpu_size``)."""
    return JudgePlan(config, judged_task(task, config, device)[0], device, 0,
                     Path()).baseline_key
