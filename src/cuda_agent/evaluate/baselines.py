"""Measure and cache the eager and torch.compile baselines of a whole benchmark on this device.

    cuda-agent baselines shared/kernelbench/kernelbench.jsonl --levels 1,2 --out runs/base

Each task's baselines are timed by the judge's own workers (fresh processes, the judge's jobs
and settings) and stored in the judge's baseline cache, so a later ``cuda-agent eval`` or
``judge`` on the same device reads them instead of timing them again. Every finished task is
appended to ``OUT/baselines.jsonl`` at once; a rerun skips the tasks already there (with
the same cache key). At the end: ``summary.json`` and ``baselines.md`` (docs/evaluation.md).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import asdict
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from cuda_agent.evaluate.baselines_report import BaselineSummary, summarize, to_markdown
from cuda_agent.evaluate.run import read_results
from cuda_agent.judge.baselines import Baselines
from cuda_agent.judge.config import JudgeConfig
from cuda_agent.tasks import Precision, Task, load_tasks

ROWS = "baselines.jsonl"


class BaselinesConfig(BaseModel):
    """Which tasks to measure, how, and for how long."""

    judge: JudgeConfig = Field(default_factory=JudgeConfig,
                               description="The judge whose timing settings are used.")
    levels: tuple[int, ...] = Field((), description="Only tasks of these levels (all if empty).")
    limit: int | None = Field(None, ge=0, description="At most this many tasks (after levels).")
    shard: tuple[int, int] = Field(
        (0, 1), description="(k, n): only the tasks whose index modulo n is k (one per GPU).")
    workers: int = Field(1, ge=1, description="Tasks measured at once (CPU only: a GPU timing "
                         "needs the whole GPU).")
    time_limit_s: float | None = Field(
        None, gt=0, description="Start no task after this many seconds; the rest stays pending.")
    retry_errors: bool = Field(False, description="Measure again tasks whose row is an error.")
    precision: Precision | None = Field(None, description="Override every task's precision.")


def select_tasks(source: str, config: BaselinesConfig) -> list[Task]:
    """The tasks to measure; a task declaring ``INPUT_SHAPES`` counts once per shape (named
    ``NAME[SHAPE]``: the judge times each shape with its own baselines)."""
    tasks = [t for t in load_tasks(source, precision=config.precision)
             if not config.levels or t.level in config.levels]
    tasks = tasks[:config.limit] if config.limit is not None else tasks
    tasks = [variant for task in tasks for variant in _at_each_shape(task)]
    k, n = config.shard
    return [t for i, t in enumerate(tasks) if i % n == k]


def _at_each_shape(task: Task) -> list[Task]:
    from cuda_agent.tasks.shapes import shape_tasks
    from cuda_agent.tasks.task import TaskError

    try:
        variants = shape_tasks(task)
    except TaskError:  # a bad INPUT_SHAPES: measured as written, the judge will say why
        return [task]
    return [shaped.model_copy(update={"name": f"{task.name}[{name}]"})
            for name, shaped in variants] or [task]


def run_baselines(tasks: str, out: Path, config: BaselinesConfig | None = None,
                  show_progress: bool = True, measure: bool = True) -> BaselineSummary:
    """Measure every selected task not yet in ``out`` (none without ``measure``); write the
    rows, the summary and the table."""
    from cuda_agent.judge.baselines import device_name
    from cuda_agent.judge.judge import resolve_device
    from cuda_agent.judge.measure import baseline_key

    config = config or BaselinesConfig()
    device = resolve_device(config.judge.device)
    if device.startswith("cuda") and config.workers > 1:
        raise ValueError("on CUDA a baseline timing needs the whole GPU: use --workers 1 "
                         "(and one --shard per GPU, each with its CUDA_VISIBLE_DEVICES)")
    task_list = select_tasks(tasks, config)
    keys = {t.label: baseline_key(t, config.judge, device) for t in task_list}
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    done = read_results(out, ROWS)
    pending = [t for t in task_list if not _finished(done.get(t.label), keys[t.label], config)]
    if pending and measure:
        def write(row: dict[str, Any]) -> None:
            write_row(out / ROWS, row)
            done[row["key"]] = row

        _measure_all(pending, config, write, show_progress)
    rows = [done[t.label] for t in task_list if _finished(done.get(t.label), keys[t.label],
                                                          config)]
    summary = summarize(rows, device_name(device), len(task_list))
    (out / "summary.json").write_text(json.dumps(asdict(summary), indent=2) + "\n")
    (out / "baselines.md").write_text(to_markdown(summary, rows))
    return summary


def write_row(path: Path, row: dict[str, Any]) -> None:
    """Append ``row`` as one line in one write: processes measuring other shards (one per
    GPU, ``baselines_spread``) append to the same file, and no line is cut by another."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(row) + "\n").encode())
    finally:
        os.close(fd)


def _finished(row: dict[str, Any] | None, key: str, config: BaselinesConfig) -> bool:
    if row is None or row.get("cache_key") != key:
        return False
    return not (config.retry_errors and row.get("error"))


def _measure_all(tasks: list[Task], config: BaselinesConfig,
                 write: Callable[[dict[str, Any]], None], show_progress: bool) -> None:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    columns = ("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    deadline = time.monotonic() + config.time_limit_s if config.time_limit_s else None
    queue = iter(tasks)
    running: dict[Future, Task] = {}
    with ThreadPoolExecutor(config.workers) as pool, \
            Progress(*columns, disable=not show_progress) as bar:
        progress = bar.add_task("baselines", total=len(tasks))

        def start_next() -> None:
            task = None if deadline and time.monotonic() > deadline else next(queue, None)
            if task is not None:
                running[pool.submit(measure_row, task, config.judge)] = task

        for _ in range(config.workers):
            start_next()
        while running:
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                task = running.pop(future)
                write(future.result())
                bar.update(progress, advance=1, description=f"baselines (last: {task.name})")
                start_next()


def measure_row(task: Task, judge: JudgeConfig) -> dict[str, Any]:
    """One row of baselines.jsonl: the task's baselines, or the reason there are none."""
    from cuda_agent.judge.baselines import device_name
    from cuda_agent.judge.judge import resolve_device
    from cuda_agent.judge.measure import baseline_key, measure_baselines

    device = resolve_device(judge.device)
    row: dict[str, Any] = {"key": task.label, "task": task.name, "level": task.level,
                           "problem_id": task.problem_id, "task_sha256": task.sha256,
                           "device": device_name(device),
                           "cache_key": baseline_key(task, judge, device)}
    start = time.perf_counter()
    try:
        measured = measure_baselines(task, judge)
    except Exception as exc:  # the reference or compile fails: a row, not the end of the run
        return {**row, "source": "error", "seconds": round(time.perf_counter() - start, 3),
                "error": f"{type(exc).__name__}: {exc}"[:2000], **_timings(None)}
    return {**row, "source": "cached" if measured.cached else "measured",
            "seconds": round(measured.seconds, 3), "error": None,
            **_timings(measured.baselines)}


def _timings(base: Baselines | None) -> dict[str, Any]:
    eager, compiled = (base.eager, base.compile) if base else (None, None)
    return {"eager_ms": eager.median_ms if eager else None,
            "compile_ms": compiled.median_ms if compiled else None,
            "eager_rel_ci": eager.rel_ci if eager else None,
            "compile_rel_ci": compiled.rel_ci if compiled else None,
            "eager": asdict(eager) if eager else None,
            "compile": asdict(compiled) if compiled else None,
            "bandwidth_gbs": base.bandwidth_gbs if base else None,
            "time_meaning": base.meaning if base else None}
