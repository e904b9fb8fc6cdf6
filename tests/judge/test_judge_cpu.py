"""End to end on the CPU: workspace init -> kernel -> build -> judge, with real compiles and
real worker processes. Each bad candidate must get reward -1 with the reason named, and must
not take the judge down."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from cuda_agent.judge import Candidate, Judge, JudgeConfig
from cuda_agent.judge.config import JUDGE_VERSION
from cuda_agent.tasks import load_task
from cuda_agent.workspace import init_workspace
from tests.conftest import SCALE_ADD_MODEL_NEW, write_solution
from tests.judge.conftest import FreshInline

CHECK_ONLY = JudgeConfig(device="cpu", time=False, trials=3)


@pytest.fixture
def workspace(tmp_path: Path, scale_add_task: Path) -> Path:
    root = init_workspace(load_task(scale_add_task), tmp_path / "ws", "cpu")
    write_solution(root)
    return root


def judge(task_path: Path, candidate: Path, config: JudgeConfig = CHECK_ONLY):
    return Judge(config).judge(load_task(task_path), Candidate.from_ref(candidate))


def test_honest_workspace_is_correct_and_timed(scale_add_task: Path, workspace: Path):
    config = JudgeConfig(device="cpu", time_compile=False, min_runs=5, time_budget_s=0.5)
    result = judge(scale_add_task, workspace, config)
    assert (result.compiled, result.correct) == (True, True), result.reasons
    assert result.reward in (1, 2)
    assert result.runtime_ms > 0 and result.eager_ms > 0 and result.compile_ms is None
    assert result.speedup_vs_eager == pytest.approx(result.eager_ms / result.runtime_ms)
    assert result.correctness.trials == 5  # as asked
    assert result.correctness.checked_calls == 7  # 5 kept calls + 2 at other input scales
    assert result.correctness.max_abs_error < 1e-4
    assert result.judge_version == JUDGE_VERSION and result.seed is not None
    assert result.timing.ci_low_ms <= result.timing.median_ms <= result.timing.ci_high_ms
    assert result.runtime_ms == result.timing.median_ms
    assert "the judge's own clock" in result.time_meaning
    assert result.eager_timing is not None and result.eager_timing.runs >= 5
    assert "reward capped at 2" in " ".join(result.reasons)
    phases = dict(result.phases)  # the worker's stages, the last one and timing's parts too
    for name in ("candidate.calibrate", "candidate.timing", "candidate.timing.warmup",
                 "candidate.timing.timed", "reference_kept", "compare"):
        assert phases[name] > 0.0, (name, phases)
    assert phases["candidate.timing.timed"] < phases["candidate.timing"]


@pytest.mark.slow
def test_builtin_example_with_compile_baseline():
    config = JudgeConfig(device="cpu", min_runs=5, time_budget_s=0.5)
    result = Judge(config).judge(load_task("builtin:gelu_bias_scale"),
                                 Candidate.from_ref("builtin:gelu_bias_scale", "cpu"))
    assert result.correct, result.reasons
    assert result.compile_ms is not None and result.speedup_vs_compile is not None
    assert result.reward >= 1


def test_unchanged_stub_fails_at_forward(tmp_path: Path, scale_add_task: Path):
    root = init_workspace(load_task(scale_add_task), tmp_path / "ws", "cpu")
    result = judge(scale_add_task, root)
    assert result.reward == -1 and result.compiled
    assert "forward" in result.reasons[0] and "NotImplementedError" in result.reasons[0]


def test_wrong_kernel(scale_add_task: Path, workspace: Path):
    kernel = workspace / "kernels" / "scale_add.cpp"
    kernel.write_text(kernel.read_text().replace("alpha * x[i] + y[i]", "alpha * x[i] - y[i]"))
    result = judge(scale_add_task, workspace)
    assert result.reward == -1 and result.compiled and not result.correct
    assert "elements outside atol" in result.reasons[0]


def test_build_error_is_reported_with_line(scale_add_task: Path, workspace: Path):
    kernel = workspace / "kernels" / "scale_add.cpp"
    kernel.write_text(kernel.read_text().replace("alpha * x[i]", "alpha * nope[i]"))
    result = judge(scale_add_task, workspace)
    assert result.reward == -1 and not result.compiled
    assert result.reasons[0].startswith("build failed: kernels/scale_add.cpp:")
    assert result.build.errors[0].line is not None


def test_a_failed_build_does_not_wait_for_a_slow_reference(tmp_path: Path, workspace: Path):
    """The reference runs beside the build (nothing to time): when the build fails, the
    judge kills it rather than waiting for it. Its real calls sleep an hour (not its call on
    the meta device, which sizes the task): a judge that waited would be stopped by its
    process timeout, so the verdict would come after that and say so."""
    import time

    from tests.conftest import SCALE_ADD_TASK

    slow = tmp_path / "slow.py"
    slow.write_text(SCALE_ADD_TASK.replace(
        "        return self.alpha * x + y",
        "        import time\n        if x.device.type != 'meta':\n"
        "            time.sleep(3600)\n        return self.alpha * x + y"))
    kernel = workspace / "kernels" / "scale_add.cpp"
    kernel.write_text(kernel.read_text().replace("alpha * x[i]", "alpha * nope[i]"))
    timeout = 600.0
    judge_ = Judge(CHECK_ONLY.model_copy(update={"process_timeout_s": timeout}))
    start = time.monotonic()
    result = judge_.judge(load_task(slow), Candidate.from_ref(workspace))
    assert result.reward == -1 and result.reasons[0].startswith("build failed"), result.reasons
    assert not any("timed out" in r for r in result.reasons), result.reasons
    assert time.monotonic() - start < timeout  # what waiting for the reference would take


def test_segfault_does_not_take_the_judge_down(scale_add_task: Path, workspace: Path):
    kernel = workspace / "kernels" / "scale_add.cpp"
    kernel.write_text(kernel.read_text().replace(
        "(void)config;", "(void)config; *(volatile int*)nullptr = 1;"))
    result = judge(scale_add_task, workspace)
    assert result.reward == -1
    assert "SIGSEGV" in result.reasons[0]
    write_solution(workspace)
    assert judge(scale_add_task, workspace).correct  # the judge still works afterwards


@pytest.mark.slow
def test_hang_is_killed(scale_add_task: Path, workspace: Path):
    (workspace / "model_new.py").write_text(SCALE_ADD_MODEL_NEW.replace(
        "        return cuda_extension", "        while True:\n            pass\n"
        "        return cuda_extension"))
    config = CHECK_ONLY.model_copy(update={"process_timeout_s": 15})
    result = judge(scale_add_task, workspace, config)
    assert result.reward == -1 and "timed out after 15 s (stage: forward)" in result.reasons[0]


@pytest.mark.parametrize(
    ("forward", "needle"),
    [
        ("out = cuda_extension.scale_add(x, y, self.alpha)\n        x.zero_()\n"
         "        return out", "input 0 was modified by forward()"),
        ("cuda_extension.scale_add(x, y, self.alpha)\n        return 3",
         "output 0 is a int, not a plain torch.Tensor"),
        ("return cuda_extension.scale_add(x, y, self.alpha).as_subclass(Sneaky)",
         "not a plain torch.Tensor"),
    ],
)
def test_rule_breaking_outputs(scale_add_task: Path, workspace: Path, forward: str, needle: str):
    (workspace / "model_new.py").write_text(
        "import torch\nimport torch.nn as nn\nimport cuda_extension\n\n"
        "class Sneaky(torch.Tensor):\n    pass\n\n"
        "class ModelNew(nn.Module):\n"
        "    def __init__(self, alpha):\n        super().__init__()\n        self.alpha = alpha\n\n"
        f"    def forward(self, x, y):\n        {forward}\n")
    result = judge(scale_add_task, workspace)
    assert result.reward == -1 and needle in result.reasons[0], result.reasons


def test_missing_model_new_and_bad_state_dict(tmp_path: Path, scale_add_task: Path):
    path = tmp_path / "cand.py"
    path.write_text("x = 1\n")
    result = judge(scale_add_task, path)
    assert result.reward == -1 and not result.compiled
    assert "defines no class `ModelNew`" in result.reasons[0]
    path.write_text("import torch\nclass ModelNew(torch.nn.Module):\n"
                    "    def __init__(self, a):\n        super().__init__()\n"
                    "        self.w = torch.nn.Parameter(torch.ones(1))\n"
                    "    def forward(self, x, y):\n        return x\n")
    result = judge(scale_add_task, path)
    assert result.reward == -1 and "load_state_dict failed" in result.reasons[0]


@pytest.mark.slow
def test_single_file_load_inline_candidate(fresh_inline: FreshInline):
    # its compile kept from its first judgement (``fresh_inline``), which compiled it
    result = judge(fresh_inline.task, fresh_inline.candidate)
    assert result.correct and result.compiled and result.reward == 1, result.reasons


def test_candidate_snapshot_rejects_links(tmp_path: Path, scale_add_task: Path, workspace: Path):
    (workspace / "kernels" / "x.h").symlink_to(workspace / "model.py")
    result = judge(scale_add_task, workspace)
    assert result.reward == -1 and "symbolic links are not allowed" in result.reasons[0]
    (workspace / "kernels" / "x.h").unlink()
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.h").write_text("// not the candidate's\n")
    (workspace / "kernels" / "sub").symlink_to(tmp_path / "outside")
    result = judge(scale_add_task, workspace)
    assert result.reward == -1 and "kernels/sub: symbolic links" in result.reasons[0]


@pytest.mark.slow
def test_kernelbench_layernorm_workspace(tmp_path: Path, kernelbench: Path):
    """KernelBench L1/40 with smaller sizes: init a workspace, put in a C++ kernel, judge."""
    import re
    import shutil

    code = load_task(f"{kernelbench}::1/40").code
    for name, value in (("batch_size", 2), ("features", 8), ("dim1", 32), ("dim2", 48)):
        code = re.sub(rf"^{name} = \d+$", f"{name} = {value}", code, flags=re.M)
    task_path = tmp_path / "layernorm_small.py"
    task_path.write_text(code)
    root = init_workspace(load_task(task_path), tmp_path / "ws", "cpu")
    solution = Path(__file__).resolve().parents[2] / "benchmarks" / "kernelbench_l1_cpu" / \
        "40_LayerNorm"
    shutil.rmtree(root / "kernels")
    shutil.copytree(solution / "kernels", root / "kernels")
    shutil.copyfile(solution / "model_new.py", root / "model_new.py")
    result = judge(task_path, root)
    assert result.correct and result.reward == 1, result.reasons
    assert result.correctness.max_abs_error < 1e-4


def test_candidate_process_never_sees_the_reference_model(scale_add_task: Path, workspace: Path):
    """The candidate looks for the reference in its job file and, at forward time, among all
    live objects (gc). It answers correctly only if it finds nothing. (The gc probe is done
    from a helper module, since model_new.py itself may not introspect the process.)"""
    (workspace / "kernels" / "probe.h").write_text("// the probe lives in Python\n")
    path = workspace / "model_new.py"
    path.write_text(textwrap.dedent('''
        import sys
        import torch.nn as nn
        import cuda_extension

        collector = getattr(sys, "mod" + "ules")["g" + "c"]


        def reachable():
            for o in collector.get_objects():
                try:
                    if type(o) is type and o.__name__ == "Model" and nn.Module in o.__mro__:
                        return True
                    if type(o) is dict and "class Model(" in str(o.get("task_code", "")):
                        return True  # the job the worker received
                except Exception:
                    continue
            return False

        class ModelNew(nn.Module):
            def __init__(self, alpha):
                super().__init__()
                self.alpha = alpha

            def forward(self, x, y):
                if reachable():
                    raise RuntimeError("the reference Model was reachable")
                return cuda_extension.scale_add(x, y, self.alpha)
    '''))
    result = judge(scale_add_task, workspace)
    assert result.correct, result.reasons


def test_a_judge_keeps_its_warm_sets_started_and_takes_the_oldest(scale_add_task: Path,
                                                                   workspace: Path):
    """With ``warm_sets`` 2 a judgement takes the set started first and leaves the other
    waiting, so a call right after it finds one whose start-up is over."""
    config = CHECK_ONLY.model_copy(update={"keep_warm": True, "warm_sets": 2})
    task, candidate = load_task(scale_add_task), Candidate.from_ref(workspace)
    with Judge(config) as warm:
        assert warm.warm(timeout_s=300)
        older, newer = ([w.proc for w in s] for s in warm._spares)
        result = warm.judge(task, candidate)
        assert all(p.poll() is not None for p in older)  # taken, used, ended
        assert all(p.poll() is None for p in newer)
        assert [w.proc for w in warm._spares[0]] == newer and len(warm._spares) == 2
        kept = [w.proc for s in warm._spares for w in s]
    assert result.correct, result.reasons
    assert all(p.poll() is not None for p in kept)  # close() stopped both sets


def test_warm_judge_reuses_prestarted_workers_and_stops_them(scale_add_task: Path,
                                                             workspace: Path):
    config = CHECK_ONLY.model_copy(update={"keep_warm": True})
    task, candidate = load_task(scale_add_task), Candidate.from_ref(workspace)
    with Judge(config) as warm:
        first = warm.judge(task, candidate)
        spares = [w.proc for s in warm._spares for w in s]
        assert len(spares) == 2 and all(p.poll() is None for p in spares)
        before = _uptime()
        second = warm.judge(task, candidate)
        assert all(p.poll() is not None for p in spares)  # used up, then ended
        fresh = [w.proc for s in warm._spares for w in s]
        # on the CPU the next pair starts when a judgement ends, not beside its timed calls
        assert all(_started(p.pid) >= before + 0.5 * second.seconds for p in fresh)
    assert first.correct and second.correct, (first.reasons, second.reasons)
    assert all(p.poll() is not None for p in fresh)  # close() stopped the new spares
    phases = dict(second.phases)
    for name in ("build", "reference", "candidate", "compare", "candidate.forward",
                 "reference_kept"):
        assert phases[name] >= 0.0, name


@pytest.mark.slow
def test_every_declared_shape_is_judged_and_a_shape_specialised_kernel_fails(
        tmp_path: Path, workspace: Path):
    from tests.conftest import SCALE_ADD_TASK

    task_path = tmp_path / "shapes.py"
    shapes = 'INPUT_SHAPES = {"large": {"N": 100_003}, "small": {"N": 4096}}\n'
    task_path.write_text(SCALE_ADD_TASK.replace("N = 100_003\n", "N = 100_003\n" + shapes))
    config = JudgeConfig(device="cpu", time_compile=False, min_runs=5, time_budget_s=0.3,
                         trials=2, scales=())
    result = judge(task_path, workspace, config)
    assert result.correct and [s.name for s in result.shapes] == ["large", "small"]
    assert all(s.correct and s.runtime_ms and s.eager_ms for s in result.shapes)
    assert result.runtime_ms == pytest.approx(sum(s.runtime_ms for s in result.shapes))
    assert result.reward == min(s.reward for s in result.shapes)
    assert result.correctness.trials == 2  # as asked, at each shape
    assert result.correctness.checked_calls == 4  # 2 trials at each shape

    # hard-coding the primary shape passes there and fails at the other shape
    (workspace / "model_new.py").write_text(SCALE_ADD_MODEL_NEW.replace(
        "x.contiguous(), y.contiguous()", "x.view(100_003), y.view(100_003)"))
    result = judge(task_path, workspace, CHECK_ONLY)
    assert not result.correct and result.reward == -1
    assert [(s.name, s.correct) for s in result.shapes] == [("large", True), ("small", False)]
    assert any(r.startswith("[shape small]") for r in result.reasons), result.reasons


def test_an_undeclared_shape_is_refused_before_any_work(scale_add_task: Path, workspace: Path):
    from cuda_agent.judge.judge import JudgeError

    with pytest.raises(JudgeError, match="declares no such input shape"):
        judge(scale_add_task, workspace, CHECK_ONLY.model_copy(update={"shape": "large"}))


def test_outputs_over_the_budget_are_checked_in_fewer_trials(scale_add_task: Path,
                                                             workspace: Path):
    """A budget smaller than one trial's outputs: two trials (a fresh and a scaled one) and
    one timed set are checked, the verdict says so, and an answer that ignores its inputs
    still fails."""
    config = CHECK_ONLY.model_copy(update={"output_budget_gb": 1e-9, "trials": 5})
    result = judge(scale_add_task, workspace, config)
    assert result.correct, result.reasons
    assert any("over the output budget" in f and "2 of 7 calls checked" in f
               for f in result.flags), result.flags
    (workspace / "model_new.py").write_text(SCALE_ADD_MODEL_NEW.replace(
        "        return cuda_extension.scale_add(x.contiguous(), y.contiguous(), self.alpha)",
        "        if not hasattr(self, 'kept'):\n"
        "            self.kept = (x.clone(), y.clone())\n"
        "        return cuda_extension.scale_add(*self.kept, self.alpha)"))
    result = judge(scale_add_task, workspace, config)
    assert not result.correct and "trial 1" in result.reasons[0], result.reasons


def test_a_shared_gpu_lock_makes_the_judge_wait_for_its_turn(tmp_path: Path,
                                                             scale_add_task: Path):
    """With ``gpu_lock`` the judge runs its reference, candidate and comparisons only while
    it holds the GPU's turn: held exclusive elsewhere, the judgement waits, then ends once
    it is free."""
    import fcntl
    import os
    import threading
    import time

    candidate = tmp_path / "plain.py"  # a file candidate: nothing to build before the turn
    candidate.write_text("import torch.nn as nn\n\nclass ModelNew(nn.Module):\n"
                         "    def __init__(self, alpha):\n        super().__init__()\n"
                         "        self.alpha = alpha\n\n"
                         "    def forward(self, x, y):\n        return self.alpha * x + y\n")
    lock = tmp_path / "locks" / "gpu0.lock"
    lock.parent.mkdir()
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    config = CHECK_ONLY.model_copy(update={"gpu_lock": str(lock)})
    results = []
    thread = threading.Thread(target=lambda: results.append(judge(scale_add_task, candidate,
                                                                  config)))
    thread.start()
    time.sleep(8.0)
    assert thread.is_alive() and not results  # waiting for the GPU's turn
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)
    thread.join(300)
    phases = dict(results[0].phases)
    # a free lock is taken at once; what the judgement does before asking for it (sizing a
    # task new to this home, say) shortens the wait below the 8 s the lock was held
    assert phases["gpu_wait"] + phases["workers_start"] >= 1.0, phases
    assert phases["gpu_held"] > 0 and "reference" in phases
    assert results[0].compiled  # judged (this plain-PyTorch answer is then refused)


def test_judges_sharing_a_gpu_lock_measure_a_new_task_s_baselines_once(tmp_path: Path,
                                                                         workspace: Path):
    """Two judgements of a task whose baselines are not cached, waiting for the same GPU
    turn: the first to get it measures them, the second finds them cached in its turn."""
    import fcntl
    import threading
    import uuid

    from tests.conftest import SCALE_ADD_TASK

    task = tmp_path / "fresh.py"
    task.write_text(SCALE_ADD_TASK + f"\n# {uuid.uuid4().hex}\n")
    lock = tmp_path / "gpu0.lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)  # both judgements start before either can take the turn
    # sharing is what this tests, not the noise rule: an unsteady baseline (a wide interval,
    # or the judge's clock at odds with the calls', as a loaded machine gives) is not kept,
    # and the second judgement would measure its own
    config = JudgeConfig(device="cpu", time_compile=False, min_runs=5, time_budget_s=0.3,
                         trials=2, scales=(), gpu_lock=str(lock), trusted_rel_ci=100.0,
                         clock_slack_wall_ms=1000.0)
    results = []
    threads = [threading.Thread(target=lambda: results.append(judge(task, workspace, config)))
               for _ in range(2)]
    for thread in threads:
        thread.start()
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)
    for thread in threads:
        thread.join(300)
    assert len(results) == 2 and all(r.correct for r in results), results
    # one measurement, shared: one judgement measured, the other read it (a steady fresh
    # check faster than it takes its place for that judgement, and says so)
    assert sorted(b.source for r in results for b in r.baselines) == ["cached", "measured"]
    first, second = sorted(results, key=lambda r: r.baselines[0].source != "measured")
    assert second.eager_timing == first.eager_timing or any(
        "fresh check" in f for f in second.flags), second.flags
    assert results[0].eager_timing.runs >= 5


def test_judges_sharing_a_gpu_lock_time_only_while_no_other_judge_holds_it(
        tmp_path: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch):
    """Two timed judgements at once under one GPU lock, the holds and timed spans logged
    (``gpu_turn.LOG_ENV``): every timed span of a judge's workers (stand-ins; warm-up's end
    to tail's end) lies inside an exclusive hold of that judge, and no exclusive hold
    overlaps any hold of the other judge."""
    import json
    import threading
    import uuid

    from cuda_agent.judge.gpu_turn import LOG_ENV
    from tests.conftest import SCALE_ADD_TASK

    log = tmp_path / "turns.jsonl"
    monkeypatch.setenv(LOG_ENV, str(log))
    task = tmp_path / "fresh.py"  # baselines not cached: one judge measures them
    task.write_text(SCALE_ADD_TASK + f"\n# {uuid.uuid4().hex}\n")
    config = JudgeConfig(device="cpu", time_compile=False, min_runs=5, time_budget_s=0.3,
                         trials=2, scales=(), gpu_lock=str(tmp_path / "gpu0.lock"))
    results = []

    def run() -> None:
        with Judge(config) as one:
            results.append(one.judge(load_task(task), Candidate.from_ref(workspace)))

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(600)
    assert len(results) == 2 and all(r.correct for r in results), results
    spans: dict[str, list[dict]] = {}
    for line in log.read_text().splitlines():
        span = json.loads(line)
        spans.setdefault(span["turn"], []).append(span)
    assert len(spans) == 2, spans.keys()
    for name, own in spans.items():
        exclusive = [s for s in own if s["kind"] == "exclusive"]
        timed = [s for s in own if s["kind"] == "timing"]
        assert len(timed) >= 2, own  # the candidate's stand-ins and its timed calls
        for span in timed:
            assert any(e["start"] <= span["start"] and span["end"] <= e["end"]
                       for e in exclusive), (span, exclusive)
        others = [s for other, theirs in spans.items() if other != name for s in theirs
                  if s["kind"] != "timing"]
        for mine in exclusive:
            for theirs in others:
                assert mine["end"] <= theirs["start"] or theirs["end"] <= mine["start"], \
                    (mine, theirs)
    for result in results:
        phases = dict(result.phases)
        assert 0 < phases["gpu_exclusive"] < phases["gpu_held"], phases


def test_a_reference_without_a_float64_twin_is_not_called_over_budget(tmp_path: Path,
                                                                       workspace: Path):
    """A reference model that cannot be copied to float64 (it holds a lock) is judged by
    tolerances, and says so; every trial is still checked (no output-budget note)."""
    from tests.conftest import SCALE_ADD_TASK

    task = tmp_path / "locked.py"
    task.write_text("import threading\n" + SCALE_ADD_TASK.replace(
        "        self.alpha = alpha\n", "        self.alpha = alpha\n"
        "        self.guard = threading.Lock()\n"))
    result = judge(task, workspace)
    assert result.correct, result.reasons
    assert any("float64 reference unavailable" in f for f in result.flags), result.flags
    assert not any("output budget" in f for f in result.flags), result.flags


def _uptime() -> float:
    return float(Path("/proc/uptime").read_text().split()[0])


def _started(pid: int) -> float:
    """When process ``pid`` started, in seconds since boot (as ``_uptime``)."""
    from cuda_agent.procs import snapshot

    return snapshot()[pid].start / os.sysconf("SC_CLK_TCK")
