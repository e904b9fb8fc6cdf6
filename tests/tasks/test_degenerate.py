"""The degenerate-task rule on the reference's own trials: constants, repeated values and
inputs that pass the judge's comparison at every trial are named; honest near-misses are not."""

from __future__ import annotations

import pytest
import torch

from cuda_agent.tasks.degenerate import Degeneracy, degenerate, passes
from tests.tasks.degenerate_cases import CASES, task, trials


@pytest.mark.parametrize("name", sorted(CASES))
def test_case_is_named_by_its_reason(name):
    case = CASES[name]
    reason = degenerate(*trials(case.code))
    if case.reason is None:
        assert reason is None, reason
    else:
        assert reason is not None and reason.startswith(case.reason), reason
        assert reason.endswith("at every trial (7 of 7)"), reason


def test_norm_except_dim_is_degenerate_only_at_a_looser_tolerance():
    """At 1e-2 one constant passes every fresh draw but no scaled one, and the four norms
    are one repeated value at every trial; at the judge's fp32 1e-4 nothing passes."""
    outputs, inputs = trials(CASES["norm_except_dim"].code)
    assert degenerate(outputs, inputs) is None
    loose = degenerate(outputs, inputs, atol=1e-2, rtol=1e-2)
    assert loose is not None and loose.startswith(
        "degenerate task: one repeated value (the trial's mean)"), loose
    fresh = [o[0] for o in outputs[:5]]
    level = float(torch.cat([ref.flatten() for ref in fresh]).mean())
    assert all(passes(ref, level, 1e-2, 1e-2) for ref in fresh)  # the fresh draws agree
    assert not any(passes(ref, level) for ref in fresh)
    assert not any(passes(o[0], level, 1e-2, 1e-2) for o in outputs[5:])


def test_sparse_rounding_passes_a_zero_answer_only_at_the_small_scale():
    outputs, _ = trials(CASES["pool_round_sparse"].code)
    zero_share = float((outputs[0][0] == 0).double().mean())
    assert 0.99 < zero_share < 1.0
    assert [passes(o[0], 0.0) for o in outputs] == [False] * 5 + [True, False]


def test_every_trial_must_pass():
    """A constant that fits every fresh draw but not the scaled ones does not name the task."""
    pinned = task("return torch.clamp(x, max=0.5)", "torch.rand(64, 256) + 1.0")
    outputs, inputs = trials(pinned, scales=())
    assert degenerate(outputs, inputs).startswith("degenerate task: a constant 0.5 passes")
    outputs, inputs = trials(pinned)  # at x0.25 the inputs lie below 0.5 and come through
    assert degenerate(outputs, inputs) is None


def test_integer_outputs_compare_exactly():
    gen = torch.Generator().manual_seed(3)
    x = [torch.randn(64, 256, generator=gen) for _ in range(3)]
    assert degenerate([[(t > 0).long()] for t in x], [[t] for t in x]) is None
    assert degenerate([[(t > 100).long()] for t in x], [[t] for t in x]).startswith(
        "degenerate task: a constant 0 passes")
    rare = [[(t > 3.0).long()] for t in x]  # about 20 ones in 16384: 0 is not exact
    assert degenerate(rare, [[t] for t in x]) is None


def test_input_cast_to_the_output_dtype():
    gen = torch.Generator().manual_seed(5)
    x = [torch.randn(32, 32, generator=gen) for _ in range(3)]
    reason = degenerate([[t.double()] for t in x], [[t] for t in x])
    assert reason.startswith("degenerate task: input 0 cast to float64 passes"), reason
    other = [[torch.randn(32, 32, generator=gen), t] for t in x]  # the second is the one
    assert "input 1 passes" in degenerate([[t.clone()] for t in x], other)


def test_stops_once_no_answer_is_left():
    check = Degeneracy()
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(1))
    check.add([torch.tanh(x)], [x])
    assert not check.open and check.reason() is None
    assert Degeneracy().open
