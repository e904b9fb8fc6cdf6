"""End to end on CPU: 30 tasks through the CLI, killed with SIGKILL mid-way and resumed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import datasets
import pytest

from cuda_agent.synth.dataset import PARQUET, ROWS, VERDICTS, read_jsonl
from cuda_agent.tasks.loaders import load_tasks

SMALL = ["--set", "compose.min_numel_cpu=16384", "--set", "compose.max_numel_cpu=131072",
         "--set", "filters.min_ms_cpu=0.05"]


def _cmd(out, count=30):
    return [sys.executable, "-m", "cuda_agent", "synth", "--count", str(count), "--out",
            str(out), "--no-compile", "--workers", "2", *SMALL]


@pytest.mark.slow
def test_thirty_tasks_survive_sigkill_and_load_with_datasets(tmp_path):
    out = tmp_path / "ops"
    proc = subprocess.Popen(_cmd(out), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.time() + 150
    while time.time() < deadline and len(read_jsonl(out / ROWS)) < 8:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)  # the run and its workers, mid-write if it happens
    proc.wait()
    before = read_jsonl(out / ROWS)
    assert 8 <= len(before) < 30
    done = subprocess.run(_cmd(out), capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]

    rows = read_jsonl(out / ROWS)
    ids = [r["task_id"] for r in rows]
    assert len(rows) == 30 and len(set(ids)) == 30  # nothing duplicated
    assert rows[:len(before)] == before  # nothing lost
    verdicts = read_jsonl(out / VERDICTS)
    assert len({v["task_id"] for v in verdicts}) == len(verdicts)
    assert set(ids) <= {v["task_id"] for v in verdicts if v["accepted"]}

    for kind, path in (("json", out / ROWS), ("parquet", out / PARQUET)):
        data = datasets.load_dataset(kind, data_files=str(path), split="train")
        assert data.num_rows == 30
        assert {"ops", "data_source", "code", "eager_ms", "device", "filter_version",
                "input_shapes"} <= set(data.column_names)
    tasks = list(load_tasks(out / PARQUET))
    assert len(tasks) == 30 and all(t.origin == "synthesized" and t.ops for t in tasks)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["accepted"] == 30 and summary["throughput"]["accepted_per_hour"]
    assert sum(summary["rejection_reasons"].values()) >= summary["rejected"] > 0
    assert (out / "summary.md").is_file() and (out / "runtime_hist.png").stat().st_size > 1000


@pytest.mark.slow
def test_rerun_keeps_the_summary_and_every_accepted_task_rechecks_the_same(tmp_path):
    """A rerun with nothing left to do keeps the set's throughput (not 0.0/hour); the card
    is written with the set; three re-checks of every accepted task all accept it."""
    out = tmp_path / "ops"
    first = subprocess.run(_cmd(out, count=6), capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    before = json.loads((out / "summary.json").read_text())
    assert before["throughput"]["accepted_per_hour"] > 0
    again = subprocess.run(_cmd(out, count=6), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    after = json.loads((out / "summary.json").read_text())
    assert after["throughput"] == {**before["throughput"], "last_session": after[
        "throughput"]["last_session"]}
    assert after["throughput"]["last_session"]["accepted"] == 0
    assert "0.0 accepted tasks/hour" not in (out / "summary.md").read_text()

    card = (out / "card.md").read_text()
    assert card.count("```python") == 6 and "compute-heavy share" in card
    for plot in ("op_classes", "ops_count", "runtime", "rejections"):
        assert (out / "card" / f"{plot}.png").stat().st_size > 1000
    assert after["op_classes"] and after["compute_heavy_share"] is not None
    assert after["kernelbench"]  # a path, or why it was skipped

    check = subprocess.run([sys.executable, "-m", "cuda_agent", "synth", "recheck", str(out),
                            "--times", "3"], capture_output=True, text=True, timeout=600)
    result = json.loads((out / "recheck.json").read_text())
    assert check.returncode == 0 and result["stable"] == 6, result
