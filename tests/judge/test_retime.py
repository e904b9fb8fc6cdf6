"""The candidate timed in several fresh processes (``candidate_processes``), on the CPU with
real compiles and real confined workers: the runtime is pooled over them, and every extra
process is held to the same checks as the first."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from cuda_agent.judge import Candidate, Judge, JudgeConfig
from cuda_agent.tasks import load_task
from cuda_agent.workspace import init_workspace
from tests.conftest import INLINE_SCALE_ADD, write_solution

TIMED = JudgeConfig(device="cpu", time_compile=False, min_runs=5, time_budget_s=0.3,
                    trials=2, scales=(), candidate_processes=2)


@pytest.fixture
def workspace(tmp_path: Path, scale_add_task: Path) -> Path:
    root = init_workspace(load_task(scale_add_task), tmp_path / "ws", "cpu")
    write_solution(root)
    return root


def test_runtime_pooled_over_candidate_processes(scale_add_task: Path, workspace: Path):
    task, candidate = load_task(scale_add_task), Candidate.from_ref(workspace)
    with Judge(TIMED.model_copy(update={"keep_warm": True})) as judge:
        result = judge.judge(task, candidate)
        assert len(judge._spares) == 3  # the reference's and two candidates'
    assert result.correct, result.reasons
    assert result.timing.processes == 2 and result.timing.runs >= 10
    assert result.timing.ci_low_ms <= result.timing.median_ms <= result.timing.ci_high_ms
    if any(flag.startswith("timer disagreement") for flag in result.flags):
        # a loaded machine can stall the calls the judge's own clock times; its figure wins
        assert result.runtime_ms > result.timing.median_ms
    else:
        assert result.runtime_ms == result.timing.median_ms
    phases = dict(result.phases)
    for name in ("candidate", "candidate2", "candidate2.timing", "candidate2.timing.timed"):
        assert phases[name] > 0.0, (name, phases)
    assert "candidate2.forward" not in phases  # the extra process runs no trials
    assert phases["candidate2.crosscheck"] > 0.0  # without split_timing it bursts too


def test_split_timing_shares_the_interval_and_spares_the_extra_processes(
        scale_add_task: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch):
    from cuda_agent.judge import retime
    from cuda_agent.judge.runner import Worker

    jobs: list[dict] = []
    run = Worker.run

    def noted(self: Worker, job: dict, *args: object, **kwargs: object) -> object:
        jobs.append(job)
        return run(self, job, *args, **kwargs)

    monkeypatch.setattr(Worker, "run", noted)  # the real run, its jobs noted
    split = TIMED.model_copy(update={"split_timing": True})
    result = Judge(split).judge(load_task(scale_add_task), Candidate.from_ref(workspace))
    first, second = [j for j in jobs if j.get("role") == "candidate"]
    assert first["timing"]["target_rel_ci"] == pytest.approx(0.005 * 2 ** 0.5)
    assert "warmup_s" not in first["timing"] and first.get("crosscheck", True)
    assert second["timing"]["target_rel_ci"] == first["timing"]["target_rel_ci"]
    assert second["timing"]["warmup_s"] == retime.EXTRA_WARMUP_S
    assert second["timing"]["warmup"] == retime.EXTRA_WARMUP_CALLS
    assert second["crosscheck"] is False and second["check"] is False
    assert result.correct and result.timing.processes == 2, result.reasons
    phases = dict(result.phases)
    assert phases["candidate.crosscheck"] > 0.0 and phases["candidate2.timing.timed"] > 0.0
    assert "candidate2.crosscheck" not in phases, phases  # only the first one's is read
    assert not any(f.startswith("timer cross-check missing") for f in result.flags)


def test_split_timing_widens_only_the_candidates_interval(scale_add_task: Path,
                                                          tmp_path: Path):
    """Each of n candidate processes stops at target_rel_ci x sqrt(n); the baselines keep
    their settings and so their cache key."""
    from cuda_agent.judge.plan import JudgePlan

    task = load_task(scale_add_task)

    def plan(**update: object) -> JudgePlan:
        return JudgePlan(TIMED.model_copy(update=update), task, "cpu", 7, tmp_path)

    shared = plan(split_timing=True, candidate_processes=4)
    assert shared.candidate_timing()["target_rel_ci"] == pytest.approx(0.005 * 2)
    assert shared.timing["target_rel_ci"] == pytest.approx(0.005)
    assert shared.baseline_key == plan(candidate_processes=4).baseline_key
    assert plan(candidate_processes=4).candidate_timing() == shared.timing
    assert plan(split_timing=True, candidate_processes=1).candidate_timing() == shared.timing


# Honest while the judge traces its first call (a trial, in the first process); in a process
# whose first call is untraced (a timing process's warm-up) it computes something else.
SECOND_PROCESS_WRONG = '''
import importlib
import torch.nn as nn
import cuda_extension

dispatch = importlib.import_module("torch.utils." + "_python_dispatch")
current_mode = getattr(dispatch, "_get_current_" + "dispatch_mode")


class ModelNew(nn.Module):
    traced_first = None

    def __init__(self, alpha):
        super().__init__()
        self.alpha = alpha

    def forward(self, x, y):
        if ModelNew.traced_first is None:
            ModelNew.traced_first = current_mode() is not None
        alpha = self.alpha if ModelNew.traced_first else self.alpha * 1.5
        return cuda_extension.scale_add(x.contiguous(), y.contiguous(), alpha)
'''


def test_wrong_outputs_in_a_timing_process_fail(scale_add_task: Path, workspace: Path):
    (workspace / "model_new.py").write_text(textwrap.dedent(SECOND_PROCESS_WRONG))
    task, candidate = load_task(scale_add_task), Candidate.from_ref(workspace)
    one = Judge(TIMED.model_copy(update={"candidate_processes": 1})).judge(task, candidate)
    assert one.correct, one.reasons  # one process: it is never caught out
    for config in (TIMED, TIMED.model_copy(update={"split_timing": True})):
        result = Judge(config).judge(task, candidate)
        assert not result.correct and result.reward == -1
        assert "timed output differs from the reference" in " ".join(result.reasons)


def test_a_crash_in_a_timing_process_fails(scale_add_task: Path, workspace: Path):
    (workspace / "model_new.py").write_text(textwrap.dedent(SECOND_PROCESS_WRONG).replace(
        "alpha = self.alpha if", "if not ModelNew.traced_first:\n"
        "            raise RuntimeError('untraced first call')\n        alpha = self.alpha if"))
    result = Judge(TIMED).judge(load_task(scale_add_task), Candidate.from_ref(workspace))
    assert not result.correct and result.reward == -1
    assert "candidate failed in timing process 2" in result.reasons[0], result.reasons
    assert "untraced first call" in result.reasons[0]


def test_a_file_candidate_compiles_once_for_all_its_processes(tmp_path: Path,
                                                              scale_add_task: Path):
    """A single-file candidate compiles its C++ when imported; the extra timing process
    gets what the first one compiled and only loads it."""
    import uuid

    path = tmp_path / "cand.py"
    path.write_text(INLINE_SCALE_ADD + f"\n# {uuid.uuid4().hex}\n")
    result = Judge(TIMED).judge(load_task(scale_add_task), Candidate.from_ref(path))
    assert result.correct and result.timing.processes == 2, result.reasons
    phases = dict(result.phases)
    assert phases["candidate2.load"] < 0.3 * phases["candidate.load"], phases


def test_extra_processes_with_large_outputs_are_staged_in_turn(
        scale_add_task: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch):
    """Past ``LAZY_PACK_BYTES`` of timed outputs, each extra process is staged just before
    it runs and its outputs are checked at once, so no two extra packs are held together;
    wrong outputs in a later process still fail."""
    from cuda_agent.judge import retime

    monkeypatch.setattr(retime, "LAZY_PACK_BYTES", 0)  # these outputs count as large
    three = TIMED.model_copy(update={"candidate_processes": 3})
    task, candidate = load_task(scale_add_task), Candidate.from_ref(workspace)
    result = Judge(three).judge(task, candidate)
    assert result.correct and result.timing.processes == 3, result.reasons
    phases = dict(result.phases)
    for name in ("stage_candidate2", "stage_candidate3", "candidate3.timing"):
        assert phases[name] > 0.0, (name, phases)
    (workspace / "model_new.py").write_text(textwrap.dedent(SECOND_PROCESS_WRONG))
    wrong = Judge(three).judge(task, Candidate.from_ref(workspace))
    assert not wrong.correct and "timed output differs" in " ".join(wrong.reasons)
    assert "candidate3" not in dict(wrong.phases)  # failed at process 2: 3 never ran


def test_a_jobs_warm_up_seconds_reach_the_timer():
    """``split_timing`` shortens an extra process's warm-up through the job's timing."""
    from cuda_agent.judge.roles import _timing_kwargs

    timing = {"warmup": 3, "min_runs": 5, "max_runs": 50, "budget_s": 1.0,
              "target_rel_ci": 0.01}
    assert "warmup_s" not in _timing_kwargs({"timing": timing})  # the timer's default
    assert _timing_kwargs({"timing": {**timing, "warmup_s": 0.05}})["warmup_s"] == 0.05
