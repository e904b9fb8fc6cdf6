import pytest

from cuda_agent.judge.budget import fit_time, plan_kept

GB = 2**30
SCALES = (0.25, 4.0)


def test_everything_fits_within_the_budget():
    plan = plan_kept(5, SCALES, 2, 8, call_bytes=GB // 8, wide_bytes=GB // 4,
                     budget_bytes=8 * GB)
    assert (plan.keep, plan.scales, plan.extra, plan.wide) == (5, SCALES, 2, 7)
    assert not plan.reduced


def test_steps_are_taken_in_order_until_the_plan_fits():
    # 1 GiB a call, 2 GiB a float64 twin, 2 processes: 7 + 2 calls + 7 twins = 23 GiB
    def plan(budget: int):
        return plan_kept(5, SCALES, 2, 2, call_bytes=GB, wide_bytes=2 * GB,
                         budget_bytes=budget * GB)

    assert (plan(11).keep, plan(11).extra, plan(11).wide) == (5, 2, 1)  # 9 + 2
    assert (plan(10).keep, plan(10).extra, plan(10).wide) == (5, 1, 1)  # 8 + 2
    small = plan(7)  # the first process: one call at scale 1 and the first scaled one
    assert (small.keep, small.scales, small.extra, small.wide) == (1, (0.25,), 1, 1)
    assert small.reduced
    least = plan(1)
    assert (least.keep, least.scales, least.extra, least.wide) == (1, (0.25,), 1, 0)
    note = least.note(plan_kept(5, SCALES, 2, 2, GB, 2 * GB, 1 << 62), GB)
    assert "2 of 7 calls checked in the first process, 0 with a float64 reference" in note
    assert "1 of 2 in each other timing process" in note


def test_without_scaled_calls_two_at_scale_one_are_kept():
    plan = plan_kept(5, (), 2, 1, call_bytes=GB, wide_bytes=0, budget_bytes=GB, wide=False)
    assert (plan.keep, plan.scales, plan.wide) == (2, (), 0)


def test_bad_counts_are_refused():
    with pytest.raises(ValueError, match="bad plan"):
        plan_kept(0, (), 2, 1, 1, 1, 1)


def test_slow_calls_are_checked_fewer_never_without_a_float64_twin():
    """At 1 s a reference call, seven checked calls and their twins would take 42 s: the
    steps go as for memory, but the first checked call keeps its float64 twin."""
    full = plan_kept(5, SCALES, 2, 1, call_bytes=1, wide_bytes=1, budget_bytes=1 << 62)
    same, note = fit_time(full, 1, call_s=0.01, budget_s=8.0)
    assert same is full and note is None
    twins, note = fit_time(full, 1, call_s=0.3, budget_s=8.0)  # 0.3 x (21 + 3) = 7.2 s
    assert (twins.keep, twins.scales, twins.wide) == (5, SCALES, 1) and twins.reduced
    assert "7 of 7 calls checked in the first process, 1 with a float64 reference" in note
    least, note = fit_time(full, 1, call_s=5.0, budget_s=8.0)  # over, whatever is dropped
    assert (least.keep, least.scales, least.wide) == (1, (0.25,), 1)
    assert "2 of 7 calls checked" in note and "check_budget_s (8 s)" in note


def test_the_twinned_call_is_one_at_scale_one(tmp_path):
    """Where fewer calls have a twin than are checked, a call at scale 1 comes first: the
    others take their element-wise slack from the twinned ones at scale 1."""
    from cuda_agent.judge import JudgeConfig
    from cuda_agent.judge.driver import Snapshot
    from cuda_agent.judge.plan import JudgePlan
    from cuda_agent.tasks import load_task
    from tests.conftest import SCALE_ADD_TASK

    (tmp_path / "task.py").write_text(SCALE_ADD_TASK)
    plan = JudgePlan(JudgeConfig(device="cpu", check_budget_s=1.0),
                     load_task(tmp_path / "task.py"), "cpu", 3, tmp_path)
    first = {"sizes": {"outputs": [400], "wide": [800], "inputs": [400, 400]},
             "float64": True, "call_s": 2.0}
    assert "check_budget_s" in plan.learn(first, 1)
    assert (plan.kept.keep, plan.kept.scales, plan.kept.wide) == (1, (0.25,), 1)
    kept = [Snapshot(4, 1, 0.25, [], []), Snapshot(7, 2, 1.0, [], [])]
    assert [s.index for s in plan.checked_order(kept)] == [7, 4]
    unbounded = JudgePlan(JudgeConfig(device="cpu"), load_task(tmp_path / "task.py"), "cpu",
                          3, tmp_path)
    assert unbounded.learn(first, 1) is None and unbounded.kept.wide == 7
    assert unbounded.checked_order(kept) == kept
