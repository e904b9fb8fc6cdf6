"""``cuda_agent.tasks.degenerate`` judges a trivial answer as the judge's comparison does,
at the judge's tolerances (one table for both)."""

from __future__ import annotations

import pytest
import torch

from cuda_agent.judge.compare import TOLERANCES as JUDGE_TOLERANCES
from cuda_agent.judge.compare import _check
from cuda_agent.tasks.degenerate import passes
from cuda_agent.tasks.tolerance import TOLERANCES, tolerance


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_passes_agrees_with_the_judge(dtype):
    """``passes`` is the judge's element-wise and relative-norm check of the same answer."""
    gen = torch.Generator().manual_seed(7)
    ref = torch.randn(4096, generator=gen).to(dtype)
    atol, rtol = tolerance(dtype, None, None)
    nan_ref = ref.clone()
    nan_ref[::7] = float("nan")
    inf_ref = ref.clone()
    inf_ref[3] = float("inf")
    answers = [
        (ref, ref.clone()), (ref, ref + atol / 2), (ref, ref + 3 * atol),
        (ref, ref * (1 + rtol / 2)), (ref, torch.zeros_like(ref)),
        (ref.abs() * 1e-3 * atol, torch.zeros_like(ref)),  # element-wise passes, norm fails
        (nan_ref, nan_ref.nan_to_num(0.0)), (nan_ref, nan_ref.nan_to_num(1.0)),
        (inf_ref, inf_ref.clone()), (inf_ref, inf_ref.nan_to_num(posinf=0.0)),
        (ref, ref.masked_fill(ref > 2, float("inf"))),
    ]
    for reference, answer in answers:
        judged = _check(reference, answer, atol, rtol)[0] is None
        assert passes(reference, answer) == judged, (reference[:4], answer[:4])
        assert passes(reference, answer.to(torch.float64)) == judged  # cast to its dtype
    zero = torch.zeros_like(ref)
    assert passes(ref, 0.0) == (_check(ref, zero, atol, rtol)[0] is None)
    assert passes(torch.zeros(5, dtype=dtype), 0.0)


def test_one_tolerance_table():
    assert JUDGE_TOLERANCES == TOLERANCES
    assert tolerance(torch.float32, None, 5e-3) == (1e-4, 5e-3)
    assert tolerance(torch.int64, None, None) == (0.0, 0.0)
