import pytest

from cuda_agent.judge.budget import plan_kept

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
