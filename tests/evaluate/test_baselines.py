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

# caching and resuming are what these test, not the noise bound: on a loaded machine a
# short timing's interval can pass 10%, and a baseline past the bound is not cached
FAST = JudgeConfig(device="cpu", trials=2, scales=(), time_compile=False, time_budget_s=0.3,
                   trusted_rel_ci=100.0)
SETS = ["--set", "judge.trials=2", "--set", "judge.scales=[]", "--set",
        "judge.time_budget_s=0.3", "--set", "judge.trusted_rel_ci=100.0"]


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


def test_baselines_sharing_a_gpu_lock_time_only_in_their_turn(tmp_path):
    """With ``gpu_lock`` held shared elsewhere (another judge's untimed GPU work), the
    reference makes its first call (torch.compile's compilation, for the compile baseline)
    at once, sharing the GPU, then waits to have it to itself; every timed call comes after."""
    import fcntl
    import os
    import threading
    import time

    from cuda_agent.judge.measure import measure_baselines

    stamps = tmp_path / "calls.txt"
    code = RELU.replace("return torch.relu(x)", f"open({str(stamps)!r}, 'a').write("
                        "f'{__import__(\"time\").time()}\\n')\n        return torch.relu(x)")
    assert code != RELU
    (tmp_path / "stamped.py").write_text(code + f"\n# {uuid.uuid4().hex}\n")
    task = load_task(tmp_path / "stamped.py")
    lock = tmp_path / "gpu0.lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_SH)
    results = []
    config = FAST.model_copy(update={"gpu_lock": str(lock)})
    thread = threading.Thread(target=lambda: results.append(measure_baselines(task, config)))
    thread.start()
    deadline = time.time() + 120
    while not stamps.exists() and time.time() < deadline:
        time.sleep(0.2)
    time.sleep(2.0)
    assert thread.is_alive() and len(stamps.read_text().split()) == 1  # first call, then waits
    released = time.time()
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)
    thread.join(120)
    calls = [float(t) for t in stamps.read_text().split()]
    assert calls[0] < released and len(calls) > 3
    assert all(t > released for t in calls[1:])  # warm-up and timing: in the turn
    assert not results[0].cached and results[0].baselines.eager.runs >= 1


def test_a_baseline_timed_in_several_processes_is_pooled(tmp_path):
    """``baseline_processes`` fresh processes each time the eager baseline; the cached time is
    pooled over them, says how many processes made it, and has a key of its own."""
    from cuda_agent.judge.measure import baseline_key, measure_baselines

    (tmp_path / "relu.py").write_text(RELU + f"\n# {uuid.uuid4().hex}\n")
    task = load_task(tmp_path / "relu.py")
    config = FAST.model_copy(update={"baseline_processes": 2})
    assert FAST.baseline_processes_for("cpu") == 1 and FAST.baseline_processes_for("cuda") == 5
    measured = measure_baselines(task, config)
    eager = measured.baselines.eager
    assert not measured.cached and eager.processes == 2 and eager.runs >= 2
    assert eager.ci_low_ms <= eager.median_ms <= eager.ci_high_ms
    assert baseline_key(task, config, "cpu") != baseline_key(task, FAST, "cpu")
    assert measure_baselines(task, config).cached
    assert baseline_cache.load(measured.key).eager.processes == 2
