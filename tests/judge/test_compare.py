import torch

from cuda_agent.judge.compare import compare_trials


def test_exact_and_within_tolerance():
    ref = [[torch.randn(100)]]
    assert compare_trials(ref, [[ref[0][0].clone()]]).correct
    assert compare_trials(ref, [[ref[0][0] + 1e-6]]).correct


def test_failures_are_named():
    ref = torch.randn(10, 10)
    cases = {
        "outside atol": ref + 1.0,
        "expected torch.float32 (10, 10)": ref[:5],
        "non-finite values": torch.where(ref > 0, torch.nan, ref),
        "expected a plain torch.Tensor": ref.numpy(),
    }
    for needle, out in cases.items():
        result = compare_trials([[ref]], [[out]])
        assert not result.correct and needle in result.reasons[0], (needle, result.reasons)


def test_output_count_mismatch():
    result = compare_trials([[torch.ones(2), torch.ones(2)]], [[torch.ones(2)]])
    assert not result.correct and "1 outputs, expected 2" in result.reasons[0]


def test_relative_norm_catches_small_outputs_passed_by_zeros():
    ref = torch.softmax(0.1 * torch.randn(4, 1_000_000), dim=1)  # every value below atol
    result = compare_trials([[ref]], [[torch.zeros_like(ref)]])
    assert not result.correct and "relative norm error" in result.reasons[0]


def test_integer_outputs_compared_exactly():
    ref = torch.arange(10)
    assert compare_trials([[ref]], [[ref.clone()]]).correct
    assert not compare_trials([[ref]], [[ref + 1]]).correct
