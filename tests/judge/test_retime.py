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
from tests.conftest import write_solution
from tests.judge.conftest import TWO_PROCESSES, FreshInline

TIMED = TWO_PROCESSES  # as the fresh file candidate's first judgement (fresh_inline)


@pytest.fixture
def workspace(tmp_path: Path, scale_add_task: Path) -> Path:
    root = init_workspace(load_task(scale_add_task), tmp_path / "ws", "cpu")
    write_solution(root)
    return root


def test_runtime_pooled_over_candidate_processes(scale_add_task: Path, workspace: Path):
    task, candidate = load_task(scale_add_task), Candidate.from_ref(workspace)
    with Judge(TIMED.model_copy(update={"keep_warm": True})) as judge:
        result = judge.judge(task, candidate)
        assert [len(s) for s in judge._spares] == [3]  # the reference's and two candidates'
    assert result.correct, result.reasons
    assert result.timing.ci_low_ms <= result.timing.median_ms <= result.timing.ci_high_ms
    assert result.timing.processes == 2, result.flags
    assert result.runtime_ms == result.timing.median_ms and result.timing.runs >= 10
    phases = dict(result.phases)
    for name in ("candidate", "candidate2", "candidate2.calibrate", "candidate2.timing",
                 "candidate2.timing.timed", "collect_candidate2", "reference_kept"):
        assert phases[name] > 0.0, (name, phases)


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
    assert result.correct, result.reasons
    assert result.timing.processes == 2, result.flags
    assert dict(result.phases)["candidate2.timing.timed"] > 0.0


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


# Honest where the judge's first candidate process runs it; wrong (or crashing) in a process
# that can tell it is another one. Every call looks alike, so the test tells it: only the
# second candidate worker has CANDIDATE_SECOND in its environment.
SECOND_PROCESS_WRONG = textwrap.dedent('''
    import os
    import torch.nn as nn
    import cuda_extension

    SECOND = os.environ.get("CANDIDATE_SECOND") == "1"


    class ModelNew(nn.Module):
        def __init__(self, alpha):
            super().__init__()
            self.alpha = alpha

        def forward(self, x, y):
            if SECOND and os.environ.get("CANDIDATE_CRASH") == "1":
                raise RuntimeError("crashed in another process")
            alpha = self.alpha * 1.5 if SECOND else self.alpha
            return cuda_extension.scale_add(x.contiguous(), y.contiguous(), alpha)
''')


@pytest.fixture
def second_process(monkeypatch: pytest.MonkeyPatch):
    """Every candidate worker after the first gets CANDIDATE_SECOND=1 (and the variables
    given to the returned setter)."""
    from cuda_agent.judge import judge as judge_module

    made: list[int] = []
    extra: dict[str, str] = {}
    real = judge_module.Worker

    def worker(*args, candidate: bool = False, env=None, **kwargs):
        if candidate:
            made.append(1)
            if len(made) % 2 == 0:  # each judgement's set: candidate 1, candidate 2
                env = {**(env or {}), "CANDIDATE_SECOND": "1", **extra}
        return real(*args, candidate=candidate, env=env, **kwargs)

    monkeypatch.setattr(judge_module, "Worker", worker)
    return extra


def test_wrong_outputs_in_a_timing_process_fail(scale_add_task: Path, workspace: Path,
                                                second_process: dict):
    (workspace / "model_new.py").write_text(SECOND_PROCESS_WRONG)
    task, candidate = load_task(scale_add_task), Candidate.from_ref(workspace)
    one = Judge(TIMED.model_copy(update={"candidate_processes": 1})).judge(task, candidate)
    assert one.correct, one.reasons  # one process: it is never caught out
    for config in (TIMED, TIMED.model_copy(update={"split_timing": False})):
        result = Judge(config).judge(task, candidate)
        assert not result.correct and result.reward == -1
        assert "outside atol" in " ".join(result.reasons), result.reasons


def test_a_crash_in_a_timing_process_fails(scale_add_task: Path, workspace: Path,
                                           second_process: dict):
    second_process["CANDIDATE_CRASH"] = "1"
    (workspace / "model_new.py").write_text(SECOND_PROCESS_WRONG)
    result = Judge(TIMED).judge(load_task(scale_add_task), Candidate.from_ref(workspace))
    assert not result.correct and result.reward == -1
    assert "candidate failed in timing process 2" in result.reasons[0], result.reasons
    assert "crashed in another process" in result.reasons[0]


@pytest.mark.slow
def test_a_file_candidate_compiles_once_for_all_its_processes(fresh_inline: FreshInline):
    """A single-file candidate compiles its C++ when imported; the extra timing process
    gets what the first one compiled and only loads it."""
    result = fresh_inline.first  # judged with TIMED, a source never judged before
    assert result.correct, result.reasons
    assert result.timing.processes == 2, result.flags
    phases = dict(result.phases)
    assert phases["candidate2.load"] < 0.3 * phases["candidate.load"], phases


def test_extra_processes_with_large_outputs_are_staged_in_turn(
        scale_add_task: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch,
        second_process: dict):
    """Past ``LAZY_PACK_BYTES`` a kept call's pack, each extra process is staged just before
    it runs, so no two extra packs are held together; wrong outputs in a later process still
    fail."""
    from cuda_agent.judge import retime

    monkeypatch.setattr(retime, "LAZY_PACK_BYTES", 0)  # these outputs count as large
    three = TIMED.model_copy(update={"candidate_processes": 3, "settle_processes": False})
    task, candidate = load_task(scale_add_task), Candidate.from_ref(workspace)
    result = Judge(three).judge(task, candidate)
    assert result.correct, result.reasons
    assert result.timing.processes == 3, result.flags
    phases = dict(result.phases)
    for name in ("stage_candidate2", "stage_candidate3", "candidate3.timing"):
        assert phases[name] > 0.0, (name, phases)
    (workspace / "model_new.py").write_text(SECOND_PROCESS_WRONG)
    wrong = Judge(three).judge(task, Candidate.from_ref(workspace))
    assert not wrong.correct and "outside atol" in " ".join(wrong.reasons), wrong.reasons


def test_a_jobs_warm_up_seconds_reach_the_timer():
    """``split_timing`` shortens an extra process's warm-up through the job's timing."""
    from cuda_agent.judge.harness import _timing_kwargs

    timing = {"warmup": 3, "min_runs": 5, "max_runs": 50, "budget_s": 1.0,
              "target_rel_ci": 0.01}
    assert "warmup_s" not in _timing_kwargs({"timing": timing})  # the timer's default
    assert _timing_kwargs({"timing": {**timing, "warmup_s": 0.05}})["warmup_s"] == 0.05


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


def _timed(median_ms: float, judge_ms: float | None, meaning: str = "device") -> object:
    """One process's timing as the judge gets it: its own samples around ``median_ms`` and
    the judge's clock of its wall calls around ``judge_ms``."""
    from cuda_agent.judge.clock import JudgeClock
    from cuda_agent.judge.retime import Timed
    from cuda_agent.judge.runner import WorkerOutcome

    samples = [median_ms * (1 + 0.001 * k) for k in range(-5, 6)]
    result = {"samples_ms": samples, "time_meaning": meaning}
    clock = JudgeClock(() if judge_ms is None else tuple(
        judge_ms * (1 + 0.001 * k) for k in range(-5, 6)), 0.1, 1.0, 0.0, 0)
    return Timed(WorkerOutcome(True, result, None, ""), clock, [])


def _check(runs: list, meaning: str, **config) -> object:
    from cuda_agent.judge.baselines import Baselines
    from cuda_agent.judge.record import Verdict
    from cuda_agent.judge.verify import check_timing

    verdict = Verdict(None, "cuda" if meaning == "device" else "cpu", 7)
    check_timing(verdict, runs, Baselines(None, None, None, meaning), None,
                 TIMED.model_copy(update=config))
    return verdict


def test_the_processes_times_are_pooled():
    verdict = _check([_timed(1.0, 1.0, "wall"), _timed(1.2, 1.2, "wall")], "wall")
    assert verdict.runtime_ms == pytest.approx(1.1) and verdict.timing.processes == 2
    assert not verdict.flags and verdict.timing.clock_ms == pytest.approx(1.1)


@pytest.mark.parametrize("meaning", ["device", "wall"])
@pytest.mark.parametrize(("reported_ms", "judge_ms", "expected_ms", "raised"), [
    (1.0, 1.04, 1.0, False),  # within the margin: the process's own time stands
    (1.0, 1.08, 1.0, False),  # the floor 1.08 / 1.05 - 0.03 = 0.9986 is under it
    (0.5, 1.10, 1.10 / 1.05 - 0.03, True),  # reported far under the judge's clock
])
def test_a_time_is_held_to_the_judges_clock(meaning: str, reported_ms: float, judge_ms: float,
                                            expected_ms: float, raised: bool):
    verdict = _check([_timed(reported_ms, judge_ms, meaning)] * 3, meaning,
                     clock_margin=0.05, clock_slack_ms=0.03, clock_slack_wall_ms=0.03)
    assert verdict.runtime_ms == pytest.approx(expected_ms, rel=1e-6)
    assert any(f.startswith("the judge's clock bounds the time") for f in verdict.flags) \
        is raised


@pytest.mark.parametrize("meaning", ["device", "wall"])
def test_a_time_the_judges_clock_did_not_see_is_no_time(meaning: str):
    """However fast the process says it was, with no counted call on the judge's clock
    there is no time, so no speed-up."""
    verdict = _check([_timed(0.001, None)], meaning)
    assert verdict.runtime_ms is None and verdict.timing is None
    assert "no counted call was timed by the judge's clock" in verdict.flags[0]
    from cuda_agent.judge.reward import milestone_reward

    assert milestone_reward(True, verdict.runtime_ms, 1.0, 1.0, 0.95) == 1


def test_the_reward_settled_means_clear_of_every_milestone():
    """``settled``: from two processes on, the pooled time clear of each baseline's threshold
    by 3 x the processes' spread and 2% of it; one process, a time near a threshold or a
    wide spread is not settled."""
    from cuda_agent.judge.baselines import Baselines
    from cuda_agent.judge.verify import settled
    from cuda_agent.results import TimingStats

    def stats(ms: float) -> TimingStats:
        return TimingStats(ms, ms, ms, ms, 10, ms, ms, 0.0)

    base = Baselines(stats(1.0), stats(0.5), None, "device")  # thresholds 0.95 and 0.475
    assert settled(stats(0.2), [0.199, 0.201], base, 0.95)
    assert settled(stats(0.7), [0.699, 0.701], base, 0.95)  # between the two milestones
    assert not settled(stats(0.2), [0.2], base, 0.95)  # one process: no spread yet
    assert not settled(stats(0.94), [0.939, 0.941], base, 0.95)  # within 2% of 0.95
    assert not settled(stats(0.48), [0.479, 0.481], base, 0.95)  # within 2% of 0.475
    assert not settled(stats(0.7), [0.62, 0.78], base, 0.95)  # 3 x 0.16 reaches 0.475
    assert settled(stats(1.3), [1.29, 1.31], Baselines(stats(1.0), None, None, "device"),
                   0.95)  # slower than eager by far: reward 1 whatever more processes say
    assert not settled(None, [0.2, 0.2], base, 0.95)  # no time the judge's clock holds


def test_a_candidate_clear_of_every_milestone_is_timed_in_two_processes(
        tmp_path: Path, scale_add_task: Path):
    """A reference doing the candidate's work twenty times over: the candidate is clear of
    both milestones after two processes, so a judge allowed four stops there; told not to
    settle, it times all four."""
    task_file = tmp_path / "slow_ref.py"
    task_file.write_text(scale_add_task.read_text().replace(
        "return self.alpha * x + y", "for _ in range(20):\n            out = self.alpha * x + y\n"
        "        return out"))
    assert "range(20)" in task_file.read_text()
    task = load_task(task_file)
    root = init_workspace(task, tmp_path / "ws", "cpu")
    write_solution(root)
    four = TIMED.model_copy(update={"candidate_processes": 4, "time_compile": False})
    quick = Judge(four).judge(task, Candidate.from_ref(root))
    full = Judge(four.model_copy(update={"settle_processes": False})).judge(
        task, Candidate.from_ref(root))
    assert quick.correct and full.correct, (quick.reasons, full.reasons)
    assert quick.timing.processes == 2 and full.timing.processes == 4
