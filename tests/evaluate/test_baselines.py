"""`cuda-agent baselines` on the CPU: two tiny tasks (one whose reference fails) measured in
parallel without compile; a rerun resumes; the judge then reads the cached figures."""

from __future__ import annotations

import json
import uuid

import pytest
from typer.testing import CliRunner

from cuda_agent.cli.main import app
from cuda_agent.evaluate.baselines import BaselinesConfig, run_baselines, select_tasks
from cuda_agent.judge import Candidate, Judge, JudgeConfig
from cuda_agent.judge import baselines as baseline_cache
from cuda_agent.tasks import load_task
from tests.evaluate.test_run import RELU

FAST = JudgeConfig(device="cpu", trials=2, scales=(), time_compile=False, time_budget_s=0.3)
SETS = ["--set", "judge.trials=2", "--set", "judge.scales=[]", "--set",
        "judge.time_budget_s=0.3"]


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("baselines")
    tasks = root / "tasks"
    tasks.mkdir()
    # a fresh task hash per session: the baseline cache outlives test sessions
    relu = RELU + f"\n# {uuid.uuid4().hex}\n"
    (tasks / "relu.py").write_text(relu)
    (tasks / "broken.py").write_text(relu.replace("torch.relu(x)", "x.no_such_method()"))
    result = CliRunner().invoke(app, ["baselines", str(tasks), "--out", str(root / "out"),
                                      "--device", "cpu", "--no-compile", "--workers", "2",
                                      "--quiet", *SETS])
    assert result.exit_code == 0, result.output
    return root, result.output


def _rows(out):
    return {r["key"]: r for r in map(json.loads, (out / "baselines.jsonl").read_text().split(
        "\n")[:-1])}


def test_rows_summary_and_table(measured):
    root, output = measured
    rows = _rows(root / "out")
    relu, broken = rows["relu"], rows["broken"]
    assert relu["source"] == "measured" and relu["error"] is None and relu["eager_ms"] > 0
    assert relu["compile_ms"] is None and relu["eager"]["runs"] >= 1
    assert 0 <= relu["eager_rel_ci"] < 1 and relu["seconds"] > 0
    assert broken["source"] == "error" and "no_such_method" in broken["error"]
    assert broken["eager_ms"] is None and broken["eager"] is None
    summary = json.loads((root / "out" / "summary.json").read_text())
    assert summary["overall"]["tasks"] == 2 and summary["overall"]["errors"] == 1
    assert summary["overall"]["measured"] == 1 and summary["pending"] == 0
    table = (root / "out" / "baselines.md").read_text()
    assert "| overall | 2 | 1 | 0 | 1 |" in table and "| overall | 2 | 1 | 0 | 1 |" in output
    assert "| broken | - | - | - | - | error |" in table


def test_rerun_skips_and_judge_hits_the_cache(measured):
    root, _ = measured
    before = (root / "out" / "baselines.jsonl").read_text()
    config = BaselinesConfig(judge=FAST)
    assert len(select_tasks(str(root / "tasks"), config.model_copy(update={"limit": 1}))) == 1
    summary = run_baselines(str(root / "tasks"), root / "out", config, show_progress=False)
    assert (root / "out" / "baselines.jsonl").read_text() == before   # nothing re-measured
    assert summary.overall.tasks == 2 and summary.overall.errors == 1
    fresh = run_baselines(str(root / "tasks"), root / "fresh", config, False, measure=False)
    assert fresh.pending == 2 and fresh.overall.tasks == 0

    relu = _rows(root / "out")["relu"]
    cached = baseline_cache.load(relu["cache_key"])
    assert cached is not None and cached.eager.median_ms == relu["eager_ms"]
    candidate = root / "wrong.py"
    candidate.write_text("import torch.nn as nn\n\nclass ModelNew(nn.Module):\n"
                         "    def forward(self, x):\n        return x\n")
    result = Judge(FAST).judge(load_task(root / "tasks" / "relu.py"),
                               Candidate.from_ref(candidate))
    phases = dict(result.phases)
    # with the baselines cached the reference is not timed: it runs untimed during the build
    assert "reference.forward" in phases and "reference.timing" not in phases, phases


def test_a_task_with_input_shapes_is_measured_at_each_shape(tmp_path):
    """One row per declared shape, with the cache key the judge uses for that shape."""
    from cuda_agent.judge.measure import baseline_key
    from cuda_agent.tasks.shapes import shape_tasks

    code = RELU.replace("torch.randn(1000)", "torch.randn(N)").replace(
        "import torch.nn as nn\n", "import torch.nn as nn\n\nN = 1000\n"
        "INPUT_SHAPES = {'small': {'N': 1000}, 'large': {'N': 4096}}\n")
    (tmp_path / "relu.py").write_text(code)
    tasks = select_tasks(str(tmp_path), BaselinesConfig(judge=FAST))
    assert [t.name for t in tasks] == ["relu[small]", "relu[large]"]
    judged = shape_tasks(load_task(tmp_path / "relu.py"))
    assert [baseline_key(t, FAST, "cpu") for t in tasks] == \
        [baseline_key(t, FAST, "cpu") for _, t in judged]
    assert "N = 4096" in tasks[1].code
