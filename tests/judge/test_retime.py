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


def pooled_processes(result: object, n: int) -> int:
    """How many of ``n`` processes the runtime should pool. On a loaded machine (CI: two
    cores, tests in parallel) an honest process's cross-check burst can stall, so that the
    judge's clock disagrees with its median: it is left out, unless every one stalled."""
    stalled = sum(f.startswith(("timer disagreement", "timer cross-check missing"))
                  for f in result.flags)
    return n if stalled in (0, n) else n - stalled


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
    assert result.timing.ci_low_ms <= result.timing.median_ms <= result.timing.ci_high_ms
    assert result.timing.processes == pooled_processes(result, 2), result.flags
    if not result.flags:
        assert result.runtime_ms == result.timing.median_ms and result.timing.runs >= 10
    phases = dict(result.phases)
    for name in ("candidate", "candidate2", "candidate2.timing", "candidate2.timing.timed",
                 "collect_candidate2"):
        assert phases[name] > 0.0, (name, phases)
    assert "candidate2.forward" not in phases  # the extra process runs no trials
    assert phases["candidate2.crosscheck"] > 0.0  # every process's clock is cross-checked


def test_split_timing_shares_the_interval_and_shortens_the_extra_warm_ups(
        scale_add_task: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch):
    from cuda_agent.judge import retime
    from cuda_agent.judge.runner import Worker

    jobs: list[dict] = []
    run = Worker.run

    def noted(self: Worker, job: dict, *args: object, **kwargs: object) -> object:
        jobs.append(job)
        return run(self, job, *args, **kwargs)

    monkeypatch.setattr(Worker, "run", noted)  # the real run, its jobs noted
    assert TIMED.split_timing  # the default
    result = Judge(TIMED).judge(load_task(scale_add_task), Candidate.from_ref(workspace))
    first, second = [j for j in jobs if j.get("role") == "candidate"]
    assert first["timing"]["target_rel_ci"] == pytest.approx(0.005 * 2 ** 0.5)
    assert "warmup_s" not in first["timing"]
    assert second["timing"]["target_rel_ci"] == first["timing"]["target_rel_ci"]
    assert second["timing"]["warmup_s"] == retime.EXTRA_WARMUP_S
    assert second["timing"]["warmup"] == retime.EXTRA_WARMUP_CALLS
    assert second["check"] is False
    assert result.correct, result.reasons
    assert result.timing.processes == pooled_processes(result, 2), result.flags
    phases = dict(result.phases)
    assert phases["candidate.crosscheck"] > 0.0 and phases["candidate2.timing.timed"] > 0.0
    assert phases["candidate2.crosscheck"] > 0.0  # each process's clock is read
    assert not any(f.startswith("timer cross-check missing") for f in result.flags)


def test_split_timing_widens_only_the_candidates_interval(scale_add_task: Path,
                                                          tmp_path: Path):
    """Each of n candidate processes stops at target_rel_ci x sqrt(n); the baselines keep
    their settings and so their cache key."""
    from cuda_agent.judge.plan import JudgePlan

    task = load_task(scale_add_task)

    def plan(**update: object) -> JudgePlan:
        return JudgePlan(TIMED.model_copy(update=update), task, "cpu", 7, tmp_path)

    shared = plan(candidate_processes=4)
    assert shared.candidate_timing()["target_rel_ci"] == pytest.approx(0.005 * 2)
    assert shared.timing["target_rel_ci"] == pytest.approx(0.005)
    assert shared.baseline_key == plan(candidate_processes=4, split_timing=False).baseline_key
    assert plan(candidate_processes=4, split_timing=False).candidate_timing() == shared.timing
    assert plan(candidate_processes=1).candidate_timing() == shared.timing


def traced_first_model(body: str, header: str = "") -> str:
    """model_new.py for scale_add whose forward first notes whether its process's first call
    was traced (a trial: only the first process runs trials), then runs ``body``."""
    return textwrap.dedent('''
        import importlib
        import time
        import torch.nn as nn
        import cuda_extension

        dispatch = importlib.import_module("torch.utils." + "_python_dispatch")
        current_mode = getattr(dispatch, "_get_current_" + "dispatch_mode")
        ''') + textwrap.dedent(header) + textwrap.dedent('''

        class ModelNew(nn.Module):
            traced_first = None

            def __init__(self, alpha):
                super().__init__()
                self.alpha = alpha

            def forward(self, x, y):
                if ModelNew.traced_first is None:
                    ModelNew.traced_first = current_mode() is not None
        ''') + textwrap.indent(textwrap.dedent(body).strip(), " " * 8) + "\n"


# Honest in the first process; in a process whose first call is untraced (a timing
# process's warm-up) it computes something else.
SECOND_PROCESS_WRONG = traced_first_model('''
    alpha = self.alpha if ModelNew.traced_first else self.alpha * 1.5
    return cuda_extension.scale_add(x.contiguous(), y.contiguous(), alpha)
''')


def test_wrong_outputs_in_a_timing_process_fail(scale_add_task: Path, workspace: Path):
    (workspace / "model_new.py").write_text(textwrap.dedent(SECOND_PROCESS_WRONG))
    task, candidate = load_task(scale_add_task), Candidate.from_ref(workspace)
    one = Judge(TIMED.model_copy(update={"candidate_processes": 1})).judge(task, candidate)
    assert one.correct, one.reasons  # one process: it is never caught out
    for config in (TIMED, TIMED.model_copy(update={"split_timing": False})):
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
    assert result.correct, result.reasons
    assert result.timing.processes == pooled_processes(result, 2), result.flags
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
    assert result.correct, result.reasons
    assert result.timing.processes == pooled_processes(result, 3), result.flags
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


# Honest in the first process; in a timing process it hides the time spent in forward from
# the process's own clock (the timer's reference to it).
CLOCK_IN_TIMING_PROCESS = traced_first_model('''
    if not ModelNew.traced_first and not _hidden[1:]:
        _hidden.append(True)
        timer = importlib.import_module("cuda_" + "agent.judge.timing")
        timer._clock = lambda: _real() - _hidden[0]
    start = _real()
    out = cuda_extension.scale_add(x.contiguous(), y.contiguous(), self.alpha)
    if not ModelNew.traced_first:
        _hidden[0] += _real() - start
    return out
''', "_real, _hidden = time.perf_counter, [0.0]\n")


def test_a_clock_patched_in_a_timing_process_is_caught_there(tmp_path: Path):
    """Every candidate process's calls are timed by the judge's clock too: a candidate that
    hides its time only where it guesses it is not the first process is flagged by that
    process's cross-check, and that process's timing is left out."""
    from tests.judge.adversarial.helpers import write_scale_add, write_task

    task = load_task(write_task(tmp_path, "scale_add_big"))
    honest = Judge(TIMED).judge(task, Candidate.from_ref(write_scale_add(tmp_path / "fair")))
    assert honest.correct, honest.reasons
    root = write_scale_add(tmp_path / "ws", textwrap.dedent(CLOCK_IN_TIMING_PROCESS))
    result = Judge(TIMED).judge(task, Candidate.from_ref(root))
    assert result.correct, result.reasons
    assert any(f.startswith("timer disagreement (candidate process 2)")
               for f in result.flags), result.flags
    if len(result.flags) == 1:  # the first process's burst was not stalled as well
        assert result.flags[0].endswith("the process's timing left out")
        assert result.timing.processes == 1  # the second's timing left out of the pool
    assert result.runtime_ms >= 0.5 * honest.runtime_ms, (result.runtime_ms, honest.runtime_ms)


def test_candidate_processes_default_by_device_and_in_episode():
    """None: 8 on CUDA, 1 on CPU, 1 untimed; the agent's own calls take one process unless
    their settings name a number."""
    from cuda_agent.judge.config import in_episode

    assert JudgeConfig().candidate_processes_for("cuda:0") == 8
    assert JudgeConfig().candidate_processes_for("cpu") == 1
    assert JudgeConfig(time=False).candidate_processes_for("cuda") == 1
    assert JudgeConfig(candidate_processes=2).candidate_processes_for("cpu") == 2
    quick = in_episode(JudgeConfig(trials=2))
    assert quick.candidate_processes_for("cuda") == 1 and quick.trials == 2
    assert in_episode(JudgeConfig(candidate_processes=3)).candidate_processes == 3
    assert in_episode(JudgeConfig.model_validate({"candidate_processes": None})
                      ).candidate_processes is None  # set, to the default, on purpose


def _timed(median_ms: float, judge_ms: float | None) -> object:
    """One process's timing as the judge gets it: samples around ``median_ms``, its
    cross-check burst of 10 calls and the marks the judge's clock took (none if None)."""
    from cuda_agent.judge.retime import Timed
    from cuda_agent.judge.runner import WorkerOutcome

    samples = [median_ms * (1 + 0.001 * k) for k in range(-5, 6)]
    result = {"samples_ms": samples, "time_meaning": "wall", "crosscheck_calls": 10,
              "crosscheck_ms": median_ms}
    marks = () if judge_ms is None else (("start", 1.0), ("end", 1.0 + judge_ms * 1e-2))
    return Timed(WorkerOutcome(True, result, None, "", marks), [])


@pytest.mark.parametrize(("second", "expected_ms", "processes", "flag"), [
    ((1.02, 1.0), 1.01, 2, None),  # both clocks agree: pooled
    ((0.1, 1.0), 1.0, 1, "timer disagreement (candidate process 2)"),  # patched: left out
    ((0.1, None), 1.0, 1, "timer cross-check missing (candidate process 2)"),  # no marks
])
def test_each_process_clock_decides_whether_it_is_pooled(
        scale_add_task: Path, second: tuple, expected_ms: float,
        processes: int, flag: str | None):
    from cuda_agent.judge.baselines import Baselines
    from cuda_agent.judge.record import Verdict
    from cuda_agent.judge.verify import check_timing

    verdict = Verdict(load_task(scale_add_task), "cpu", 7)
    runs = [_timed(1.0, 1.0), _timed(*second)]
    check_timing(verdict, runs, Baselines(None, None, None), {}, TIMED)
    assert verdict.runtime_ms == pytest.approx(expected_ms)
    assert verdict.timing.processes == processes
    if flag is None:
        assert not verdict.flags
    else:
        assert len(verdict.flags) == 1 and verdict.flags[0].startswith(flag)
        assert verdict.flags[0].endswith("the process's timing left out")


def test_where_no_clock_agrees_the_judges_figure_is_a_floor(scale_add_task: Path):
    from cuda_agent.judge.baselines import Baselines
    from cuda_agent.judge.record import Verdict
    from cuda_agent.judge.verify import check_timing

    verdict = Verdict(load_task(scale_add_task), "cpu", 7)
    check_timing(verdict, [_timed(0.1, 2.0), _timed(0.1, 3.0)], Baselines(None, None, None),
                 {}, TIMED)
    assert verdict.timing.processes == 2 and verdict.runtime_ms == pytest.approx(3.0)
    assert all(f.endswith("the judge's figure is used") for f in verdict.flags)
    one = Verdict(load_task(scale_add_task), "cpu", 7)
    check_timing(one, [_timed(0.1, 2.0)], Baselines(None, None, None), {}, TIMED)
    assert one.runtime_ms == pytest.approx(2.0) and one.flags[0].startswith(
        "timer disagreement: ")  # one process: no number
