import pytest

from cuda_agent.judge.budget import plan_outputs

GB = 2**30


def test_everything_fits_within_the_budget():
    plan = plan_outputs(7, 5, 2, out_bytes=GB // 8, wide_bytes=GB // 4, budget_bytes=8 * GB)
    assert plan.trials == tuple(range(7)) and plan.wide == 7 and plan.timed == 2
    assert not plan.reduced


def test_steps_are_taken_in_order_until_the_plan_fits():
    # 1 GiB outputs, 2 GiB float64 twins: full = 9 + 14 = 23 GiB
    plan = plan_outputs(7, 5, 2, out_bytes=GB, wide_bytes=2 * GB, budget_bytes=11 * GB)
    assert (plan.trials, plan.wide, plan.timed) == (tuple(range(7)), 1, 2)  # 9 + 2
    plan = plan_outputs(7, 5, 2, out_bytes=GB, wide_bytes=2 * GB, budget_bytes=10 * GB)
    assert (plan.trials, plan.wide, plan.timed) == (tuple(range(7)), 1, 1)  # 8 + 2
    plan = plan_outputs(7, 5, 2, out_bytes=GB, wide_bytes=2 * GB, budget_bytes=5 * GB)
    # the first fresh trial and the first scaled one: 3 + 2
    assert (plan.trials, plan.wide, plan.timed) == ((0, 5), 1, 1) and plan.reduced
    plan = plan_outputs(7, 5, 2, out_bytes=GB, wide_bytes=2 * GB, budget_bytes=GB)
    assert (plan.trials, plan.wide, plan.timed) == ((0, 5), 0, 1)  # the minimum, still over
    assert "2 of 7 trials checked, 0 with a float64 reference, 1 of 2" in plan.note(7, 2, GB)


def test_without_scaled_trials_the_second_fresh_one_is_kept():
    plan = plan_outputs(5, 5, 2, out_bytes=GB, wide_bytes=0, budget_bytes=GB, wide=False)
    assert (plan.trials, plan.wide, plan.timed) == ((0, 1), 0, 1)


def test_bad_counts_are_refused():
    with pytest.raises(ValueError, match="bad trial counts"):
        plan_outputs(0, 0, 2, 1, 1, 1)
