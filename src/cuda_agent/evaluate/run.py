"""Judge one answer per task of a task set and report the benchmark metrics (docs/evaluation.md).

    cuda-agent eval kernelbench.jsonl answers/ --out runs/eval1     # resumable

Each finished task is appended to ``OUT/results.jsonl`` at once, so a rerun judges only what
is missing. At the end: ``metrics.json``, ``metrics.md``, ``fast_p.png``, ``speedups.png``
and ``record.json`` (machine, versions, commit, command line, answer hashes).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from cuda_agent.evaluate import audited
from cuda_agent.evaluate.metrics import (
    FAST_P,
    EvalTable,
    TaskRecord,
    compute_table,
    record_from_judge,
    table_to_dict,
)
from cuda_agent.execution.pool import PoolConfig
from cuda_agent.tasks import Precision, Task, load_tasks

RESULTS = "results.jsonl"
NO_ANSWER = "no answer"


class EvalConfig(BaseModel):
    """An evaluation run: the judge pool (with its judge) and what the metrics report."""

    pool: PoolConfig = Field(default_factory=PoolConfig, description="Judge workers and judge.")
    fast_p: tuple[float, ...] = Field(FAST_P, description="Thresholds p of the fast_p metric.")
    precision: Precision | None = Field(None, description="Override every task's precision.")
    audit: Path | None = Field(
        None, description="A `cuda-agent synth audit` folder: also report the metrics without "
        "the problems it rejected (metrics_audited.md/.json).")


def task_key(task: Task) -> str:
    """The task's identity in results.jsonl: 'L1/19_ReLU', or its name when it has no level."""
    return task.label


def find_answer(answers: Path, task: Task) -> Path | None:
    """The task's answer in ``answers``: a folder ``NAME/`` holding model_new.py (+ kernels/)
    or a file ``NAME.py``; for KernelBench tasks also ``LEVEL_PROBLEM/`` or ``LEVEL_PROBLEM.py``
    (e.g. ``1_19``), or the same under ``levelN/``."""
    names = [task.name]
    if task.level is not None and task.problem_id is not None:
        names.append(f"{task.level}_{task.problem_id}")
    roots = [answers] + ([answers / f"level{task.level}"] if task.level is not None else [])
    for root in roots:
        for name in names:
            if (root / name / "model_new.py").is_file():
                return root / name
            if (root / f"{name}.py").is_file():
                return root / f"{name}.py"
    return None


def read_results(out: Path, name: str = RESULTS) -> dict[str, dict[str, Any]]:
    """Rows of ``OUT/results.jsonl`` (or ``OUT/name``) by task key (the last row of a key
    wins)."""
    path = out / name
    rows: dict[str, dict[str, Any]] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                rows[row["key"]] = row
    return rows


def record_from_row(row: dict[str, Any]) -> TaskRecord:
    if row.get("result"):
        return record_from_judge(row["result"], row.get("level"))
    return TaskRecord(row["task"], row.get("level"), False, -1, reason=row.get("reason", ""))


def _row(task: Task, answer: Path | None, result: Any = None, reason: str = "") -> dict:
    from cuda_agent.results import to_dict

    return {"key": task_key(task), "task": task.name, "level": task.level,
            "problem_id": task.problem_id, "task_sha256": task.sha256,
            "answer": str(answer) if answer else None, "reason": reason,
            "result": to_dict(result) if result is not None else None}


def run_eval(tasks: str, answers: Path, out: Path, config: EvalConfig | None = None,
             command: Sequence[str] = (), show_progress: bool = True) -> EvalTable:
    """Judge every task's answer not yet in ``out``, then write the metrics and the record."""
    config = config or EvalConfig()
    answers, out = Path(answers), Path(out)
    if not answers.is_dir():
        raise FileNotFoundError(f"{answers}: the answers folder does not exist")
    rejected = audited.load_rejected(config.audit) if config.audit else None
    task_list = list(load_tasks(tasks, precision=config.precision))
    keys = [task_key(t) for t in task_list]
    if len(set(keys)) != len(keys):
        raise ValueError(f"{tasks}: task names repeat; each task needs its own name")
    out.mkdir(parents=True, exist_ok=True)
    done = read_results(out)
    found = {task_key(t): find_answer(answers, t) for t in task_list}
    pending = [t for t in task_list if task_key(t) not in done]
    with (out / RESULTS).open("a") as sink:
        def write(row: dict[str, Any]) -> None:
            sink.write(json.dumps(row) + "\n")
            sink.flush()
            done[row["key"]] = row

        for task in [t for t in pending if found[task_key(t)] is None]:
            write(_row(task, None, reason=NO_ANSWER))
        jobs = [(t, found[task_key(t)]) for t in pending if found[task_key(t)] is not None]
        if jobs:
            _judge(jobs, config.pool, write, show_progress)
    records = [record_from_row(done[k]) for k in keys]
    levels = sorted({t.level for t in task_list if t.level is not None})
    table = compute_table(records, levels, config.pool.judge.faster_margin, config.fast_p)
    _write_outputs(out, table, records, config, found, tasks, command, task_list)
    if rejected is not None:
        audited.write(out, audited.audited_tables(records, rejected, levels, table.margin,
                                                  config.fast_p, str(config.audit)))
    return table


def _judge(jobs: list[tuple[Task, Path]], pool_config: PoolConfig,
           write: Callable[[dict[str, Any]], None], show_progress: bool) -> None:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from cuda_agent.execution import JobFailed, make_pool

    columns = ("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    with make_pool(pool_config) as pool, Progress(*columns, disable=not show_progress) as bar:
        progress = bar.add_task("judging", total=len(jobs))
        handles = [(task, answer, pool.submit(task, answer)) for task, answer in jobs]
        while handles:
            finished = [h for h in handles if h[2].done()]
            for item in finished:
                task, answer, handle = item
                result = handle.result()
                if isinstance(result, JobFailed):
                    write(_row(task, answer, reason=f"judge failed: {result.reason}"))
                else:
                    write(_row(task, answer, result, "; ".join(result.reasons)))
                handles.remove(item)
                bar.update(progress, advance=1, description=f"judging (last: {task.name})")
            if not finished:
                time.sleep(0.1)


def _write_outputs(out: Path, table: EvalTable, records: list[TaskRecord], config: EvalConfig,
                   answers: dict[str, Path | None], tasks: str, command: Sequence[str],
                   task_list: list[Task]) -> None:
    from cuda_agent.evaluate import plots, record
    from cuda_agent.evaluate.report import to_markdown
    from cuda_agent.judge.config import JUDGE_VERSION

    (out / "metrics.json").write_text(json.dumps(table_to_dict(table), indent=2) + "\n")
    (out / "metrics.md").write_text(to_markdown(table))
    plots.plot_fast_p(records, out / "fast_p.png")
    plots.plot_speedups(records, out / "speedups.png")
    run = {"command": list(command), "commit": record.commit(), "judge_version": JUDGE_VERSION,
           "machine": record.machine(), "config": config.model_dump(mode="json"),
           "written": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    path = out / "record.json"
    runs = json.loads(path.read_text()).get("runs", []) if path.is_file() else []
    info = {"tasks": tasks, "task_count": len(task_list),
            "precisions": sorted({t.precision.value for t in task_list}),
            "answers": record.file_hashes(answers), "runs": [*runs, run]}
    path.write_text(json.dumps(info, indent=2) + "\n")
