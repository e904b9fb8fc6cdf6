"""The timed loop's stopping rule: the interval from ``min_runs`` calls on, or the budget
from ``floor_runs`` on, by the judge's count and clock, for the candidate and the baselines
alike. Every assertion counts calls; a call is slow because it sleeps, and a busy machine
only makes it slower, which ends no run later."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from cuda_agent.judge import Candidate, Judge, JudgeConfig
from cuda_agent.judge.calls import CallChannel
from cuda_agent.judge.driver import CALIBRATE_FLOOR, DriverPlan
from cuda_agent.judge.measure import measure_baselines
from cuda_agent.judge.source import CallSource
from cuda_agent.judge.timing import measure
from cuda_agent.tasks import load_task
from cuda_agent.workspace import init_workspace
from tests.conftest import write_solution
from tests.judge.test_calls import _serve


def _calls(channel: CallChannel, phase: str, call_s: float = 0.0, idle_s: float = 0.0,
           stop: bool = True) -> int:
    """Calls of ``phase`` until the judge ends it, each taking ``call_s`` between the seed and
    ``done`` and ``idle_s`` after it; the worker asks to stop at every call (``stop``)."""
    made = 0
    while channel.need(phase, stop) is not None:
        channel.ready()
        time.sleep(call_s)
        channel.done("memfd", [], [])
        time.sleep(idle_s)
        made += 1
    return made


def _timed(plan: DriverPlan, call_s: float = 0.0, idle_s: float = 0.0) -> int:
    made: dict[str, int] = {}

    def worker(channel: CallChannel) -> None:
        _calls(channel, "calibrate")
        made["timed"] = _calls(channel, "timed", call_s, idle_s)

    _serve(plan, worker)
    return made["timed"]


def test_slow_calls_end_the_timed_phase_at_the_floor_once_the_budget_is_spent():
    """Calls of 0.05 s against a budget of 0.1 s: spent after two, so the floor decides;
    the worker asking to stop from the first call on gets no fewer than the floor."""
    plan = DriverPlan(calibrate=1, min_runs=50, floor_runs=4, budget_s=0.1,
                      rng=random.Random(1))
    assert _timed(plan, call_s=0.05) == 4


def test_past_the_floor_the_budget_decides():
    """Calls of 0.05 s against a budget of 0.4 s and a floor of 2: not before eight calls
    (the calls' own time reaches the budget at the eighth at the soonest)."""
    plan = DriverPlan(calibrate=1, min_runs=50, floor_runs=2, budget_s=0.4,
                      rng=random.Random(2))
    made = _timed(plan, call_s=0.05)
    assert 8 <= made < 50


def test_fast_calls_run_to_min_runs_whatever_the_worker_asks():
    plan = DriverPlan(calibrate=1, min_runs=12, floor_runs=3, budget_s=1000.0,
                      rng=random.Random(3))
    assert _timed(plan) == 12


def test_time_between_calls_spends_none_of_the_budget():
    """A worker idling between its calls (after ``done``, before asking for the next) cannot
    end its timing early: only the calls' own time counts."""
    plan = DriverPlan(calibrate=1, min_runs=8, floor_runs=2, budget_s=1.0,
                      rng=random.Random(4))
    assert _timed(plan, idle_s=0.3) == 8  # 2.1 s idle in all, the calls themselves ~ms


def test_a_slow_warm_up_ends_after_its_first_call():
    plan = DriverPlan(calibrate=1, warmup=4, warmup_budget_s=0.04, min_runs=3,
                      rng=random.Random(5))
    fast = DriverPlan(calibrate=1, warmup=4, warmup_budget_s=1000.0, min_runs=3,
                      rng=random.Random(5))
    made: dict[str, int] = {}

    def worker(slow: bool):
        def run(channel: CallChannel) -> None:
            _calls(channel, "calibrate")
            made[f"warmup{slow}"] = _calls(channel, "warmup", 0.05 if slow else 0.0,
                                           stop=False)  # asks for more: not heard
            _calls(channel, "timed")
        return run

    _serve(plan, worker(True))
    _serve(fast, worker(False))
    assert (made["warmupTrue"], made["warmupFalse"]) == (1, 4)


def test_slow_stand_ins_end_at_their_floor():
    plan = DriverPlan(calibrate=16, calibrate_s=0.1, min_runs=1, rng=random.Random(6))
    made: dict[str, int] = {}

    def worker(channel: CallChannel) -> None:
        made["calibrate"] = _calls(channel, "calibrate", 0.03)

    _serve(plan, worker)
    assert made["calibrate"] == CALIBRATE_FLOOR


def test_the_honest_loop_stops_by_the_budget_and_the_judge_agrees():
    """``measure`` through the judge's driver on a call of 0.03 s: it stops by the budget
    before ``min_runs``, and the judge ends the phase at its first stop (each call's time
    as the worker counts it is never more than the judge's)."""
    plan = DriverPlan(calibrate=1, min_runs=50, floor_runs=3, budget_s=0.15,
                      rng=random.Random(7))
    result: dict[str, list[float]] = {}

    def worker(channel: CallChannel) -> None:
        source = CallSource(lambda seed, scale: [], channel)
        while source.next("calibrate") is not None:
            source.ready()
            source.done([], None)
        result["samples"] = measure(lambda: time.sleep(0.03), source, "cpu", warmup=1,
                                    min_runs=50, floor_runs=3, budget_s=0.15,
                                    target_rel_ci=1e-9).samples

    driver = _serve(plan, worker)
    timed = [r for r in driver.records if r.phase == "timed"]
    assert 3 <= len(timed) < 50
    assert len(result["samples"]) == len(timed)  # no call past the worker's own stop


def test_measure_alone_stops_by_the_budget_from_the_floor():
    source = CallSource(lambda seed, scale: [])
    slow = measure(lambda: time.sleep(0.02), source, "cpu", warmup=0, min_runs=50,
                   floor_runs=4, budget_s=0.01, target_rel_ci=1e-9)
    assert len(slow.samples) == 4
    fast = measure(lambda: None, source, "cpu", warmup=0, min_runs=30, floor_runs=4,
                   budget_s=1000.0, target_rel_ci=1e-9, max_runs=30)
    assert len(fast.samples) == 30


# A budget no call can stay within: every timing stops at the floor, by the budget. Two
# trials and no scales: the three timed calls fill the reservoir, so no call follows them
# (the tail's calls, those the judge still owes, are timed too).
SPENT_AT_ONCE = {"min_runs": 50, "floor_runs": 3, "time_budget_s": 1e-4,
                 "target_rel_ci": 1e-9, "trials": 2, "scales": ()}


@pytest.mark.slow
def test_candidate_and_baselines_stop_by_the_same_rule(tmp_path: Path,
                                                        scale_add_task: Path):
    """A real judgement and a baseline measurement with a spent budget: the candidate, eager
    and torch.compile are each timed over exactly the floor of counted calls."""
    root = init_workspace(load_task(scale_add_task), tmp_path / "ws", "cpu")
    write_solution(root)
    config = JudgeConfig(device="cpu", cache_baselines=False, **SPENT_AT_ONCE)
    result = Judge(config).judge(load_task(scale_add_task), Candidate.from_ref(root))
    assert result.correct, result.reasons
    assert result.timing.runs == 3 and result.eager_timing.runs == 3
    assert result.compile_timing.runs == 3
    measured = measure_baselines(load_task(scale_add_task), config, refresh=True)
    assert measured.baselines.eager.runs == 3 and measured.baselines.compile.runs == 3
