"""The shard logic of a baseline measurement over several GPUs, on the CPU with tiny tasks:
the shards partition the tasks, and ``benchmarks/evaluate/baselines_record.py`` merges their
rows into one per task, names a task measured by two shards, and writes the versioned
record (``device_baselines.sh``)."""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

from benchmarks.evaluate.baselines_record import merge, record
from cuda_agent.evaluate.baselines import BaselinesConfig, run_baselines, select_tasks
from cuda_agent.judge.config import JUDGE_VERSION
from tests.evaluate.test_baselines import FAST
from tests.evaluate.test_run import RELU


def _tasks(root: Path, count: int) -> Path:
    tasks = root / "tasks"
    tasks.mkdir()
    for k in range(count):  # a fresh hash per session: the baseline cache outlives sessions
        (tasks / f"relu{k}.py").write_text(RELU + f"\n# {uuid.uuid4().hex}\n")
    return tasks


def test_shards_partition_the_tasks(tmp_path: Path):
    tasks = str(_tasks(tmp_path, 7))
    every = [t.label for t in select_tasks(tasks, BaselinesConfig())]
    for n in (1, 2, 3, 4, 8):
        parts = [[t.label for t in select_tasks(tasks, BaselinesConfig(shard=(k, n)))]
                 for k in range(n)]
        assert sorted(label for part in parts for label in part) == sorted(every), n
        assert sum(map(len, parts)) == len(every)


def test_two_shards_measure_each_task_once_and_merge(tmp_path: Path):
    tasks = str(_tasks(tmp_path, 2))
    out = tmp_path / "out"
    for k in range(2):  # what two GPUs' shards do, one after the other on the CPU
        run_baselines(tasks, out / f"gpu{k}", BaselinesConfig(judge=FAST, shard=(k, 2)),
                      show_progress=False)
    found = merge(out)
    assert found["rows"] == 2 and found["measured_twice"] == {}, found
    assert found["brought"] == {"gpu0": 1, "gpu1": 1}
    rows = [json.loads(line) for line in (out / "all" / "baselines.jsonl").read_text()
            .splitlines()]
    assert sorted(r["key"] for r in rows) == ["relu0", "relu1"]
    assert all(r["source"] == "measured" for r in rows)

    summary = run_baselines(tasks, out / "all", BaselinesConfig(judge=FAST),
                            show_progress=False, measure=False)
    assert summary.overall.tasks == 2 and summary.pending == 0
    path = record(out, 12.5, 2, 1, None, None)
    written = json.loads(path.read_text())
    assert path.name == f"baselines-{JUDGE_VERSION}.json"
    assert (written["done"], written["pending"], written["wall_s"]) == (2, 0, 12.5)
    assert written["commit"] and written["judge_version"] == JUDGE_VERSION

    # a task measured by two shards is named: the shard logic gave it to both
    (out / "gpu2").mkdir()
    shutil.copy(out / "gpu0" / "baselines.jsonl", out / "gpu2" / "baselines.jsonl")
    first = json.loads((out / "gpu0" / "baselines.jsonl").read_text().splitlines()[0])
    assert merge(out)["measured_twice"] == {first["key"]: ["gpu0", "gpu2"]}
