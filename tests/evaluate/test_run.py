"""End to end on the CPU: two tasks, one answered with the shipped CPU solution and one not;
results.jsonl, metrics, plots and record are written, a rerun resumes, compare prints both."""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from cuda_agent.cli.main import app
from cuda_agent.evaluate import EvalConfig, run_eval
from cuda_agent.execution import PoolConfig
from cuda_agent.judge import JudgeConfig
from cuda_agent.tasks.loaders import builtin_dir

EXAMPLE = builtin_dir() / "gelu_bias_scale"
RELU = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(1000)]


def get_init_inputs():
    return []
'''
FAST = JudgeConfig(device="cpu", trials=2, scales=(), time_compile=False, time_budget_s=0.3)


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("eval")
    tasks, answers = root / "tasks", root / "answers"
    tasks.mkdir()
    shutil.copy(EXAMPLE / "model.py", tasks / "gelu_bias_scale.py")
    (tasks / "relu.py").write_text(RELU)
    shutil.copytree(EXAMPLE / "solution" / "cpu", answers / "gelu_bias_scale")
    config = EvalConfig(pool=PoolConfig(gpus=[], cpu_workers=1, judge=FAST))
    table = run_eval(str(tasks), answers, root / "out", config, command=["test"],
                     show_progress=False)
    return root, table, config


def test_outputs(evaluated):
    root, table, _ = evaluated
    out = root / "out"
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    by_task = {row["task"]: row for row in rows}
    assert set(by_task) == {"gelu_bias_scale", "relu"}
    assert by_task["relu"]["reason"] == "no answer" and by_task["relu"]["result"] is None
    judged = by_task["gelu_bias_scale"]["result"]
    assert judged["correct"] and judged["reward"] >= 1, judged["reasons"]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["overall"]["pass_rate"] == 0.5 and table.overall.tasks == 2
    assert "| no level (2) | 50.0 |" in (out / "metrics.md").read_text()
    for plot in ("fast_p.png", "speedups.png"):
        assert (out / plot).read_bytes()[:4] == b"\x89PNG"
    record = json.loads((out / "record.json").read_text())
    assert record["task_count"] == 2 and record["precisions"] == ["fp32"]
    first = record["runs"][0]
    assert first["command"] == ["test"] and first["judge_version"] and first["commit"]
    assert first["machine"]["torch"] and first["config"]["pool"]["judge"]["trials"] == 2
    assert set(record["answers"]["gelu_bias_scale"]) >= {"model_new.py"}


def test_rerun_skips_finished_tasks_and_compare(evaluated):
    root, table, _ = evaluated
    out = root / "out"
    before = (out / "results.jsonl").read_text()
    # no pool is started: every task is already in results.jsonl
    again = run_eval(str(root / "tasks"), root / "answers", out,
                     EvalConfig(pool=PoolConfig(gpus=[], judge=JudgeConfig(device="cuda"))),
                     show_progress=False)
    assert (out / "results.jsonl").read_text() == before
    assert again == table
    other = root / "other"
    other.mkdir()
    row = next(json.loads(line) for line in before.splitlines() if '"gelu_bias_scale"' in line)
    row["result"].update(correct=False, reward=-1)
    (other / "results.jsonl").write_text(json.dumps(row) + "\n")
    # `eval TASKS ANSWERS` runs by default; only relu is missing, and it has no answer
    result = CliRunner().invoke(app, ["eval", str(root / "tasks"), str(root / "answers"),
                                      "--out", str(other), "--device", "cpu", "--quiet"])
    assert result.exit_code == 0, result.output
    assert "| overall (2) | 0.0 |" in result.output
    assert len((other / "results.jsonl").read_text().splitlines()) == 2
    runs = json.loads((out / "record.json").read_text())["runs"]
    assert len(runs) == 2 and runs[1]["command"] == []   # every invocation is recorded
    shown = CliRunner().invoke(app, ["eval", "compare", str(out), str(other)])
    assert shown.exit_code == 0, shown.output
    assert "| overall | 2 -> 2 | 50.0 -> 0.0 (-50.0) |" in shown.output
