"""`cuda-agent baselines --gpus`: one process per GPU, each on its shard, all rows in one
file; a rerun resumes. On the CPU the 'GPUs' are only the processes' pins."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from cuda_agent.evaluate.baselines_spread import visible_gpus
from tests.evaluate.test_baselines import SETS
from tests.evaluate.test_run import RELU


def test_gpus_are_named_by_count_or_index() -> None:
    assert visible_gpus("3") == ["0", "1", "2"] and visible_gpus("0, 2") == ["0", "2"]
    with pytest.raises(ValueError, match="--gpus 'x'"):
        visible_gpus("x")


@pytest.mark.slow
def test_tasks_spread_over_processes_and_a_rerun_resumes(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    tag = uuid.uuid4().hex  # a fresh task hash: the baseline cache outlives test sessions
    for i in range(3):
        (tasks / f"relu{i}.py").write_text(RELU + f"\n# {tag} {i}\n")
    argv = [sys.executable, "-m", "cuda_agent", "baselines", str(tasks), "--out",
            str(tmp_path / "out"), "--device", "cpu", "--no-compile", "--gpus", "0,1",
            "--quiet", *SETS]
    done = subprocess.run(argv, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 tasks over 2 GPUs (0, 1)" in done.stdout
    lines = (tmp_path / "out" / "baselines.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]  # every line whole
    assert sorted(r["key"] for r in rows) == ["relu0", "relu1", "relu2"]
    assert all(r["source"] == "measured" for r in rows)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["overall"]["tasks"] == 3 and summary["pending"] == 0
    again = subprocess.run(argv, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "out" / "baselines.jsonl").read_text().splitlines() == lines
