import pytest

from cuda_agent.judge.reward import milestone_reward


@pytest.mark.parametrize(
    ("correct", "t", "eager", "comp", "expected"),
    [
        (False, 1.0, 10.0, 10.0, -1),
        (True, None, None, None, 1),
        (True, 1.0, 1.0, 1.0, 1),
        (True, 0.96, 1.0, 0.5, 1),  # within 5% of eager is not faster
        (True, 0.94, 1.0, 0.5, 2),
        (True, 0.94, 1.0, None, 2),  # compile not measured: cannot earn 3
        (True, 0.94, 1.0, 0.99, 3),
        (True, 0.95, 1.0, 2.0, 1),  # exactly 0.95 x eager is not "more than 5% faster"
    ],
)
def test_milestones(correct, t, eager, comp, expected):
    assert milestone_reward(correct, t, eager, comp) == expected
