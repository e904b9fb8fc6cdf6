import pytest
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


def test_chunked_comparison_matches_whole_tensor_figures(monkeypatch):
    import cuda_agent.judge.compare as compare

    ref = torch.randn(10_000, dtype=torch.float32)
    out = ref + 1e-6 * torch.randn_like(ref)
    out[9_999] += 1.0  # in the last chunk
    whole = compare_trials([[ref]], [[out]])
    monkeypatch.setattr(compare, "CHUNK", 1_000)
    chunked = compare_trials([[ref]], [[out]])
    assert chunked.reasons == whole.reasons and "1 of 10000 elements" in chunked.reasons[0]
    assert chunked.max_abs_error == pytest.approx(whole.max_abs_error)
    assert chunked.max_rel_error == pytest.approx(whole.max_rel_error)
    out[9_999] = float("nan")  # a non-finite value is named first, whatever chunk it is in
    assert "non-finite values" in compare_trials([[ref]], [[out]]).reasons[0]


def test_norm_check_only_from_norm_from():
    ref = torch.softmax(0.1 * torch.randn(2, 100_000), dim=1)
    zeros = torch.zeros_like(ref)
    assert compare_trials([[ref], [ref]], [[zeros], [ref]], norm_from=1).correct
    assert not compare_trials([[ref], [ref]], [[ref], [zeros]], norm_from=1).correct


def test_checks_leave_float64_references_and_outputs_unchanged():
    from cuda_agent.judge.compare import eager_errors, precision_budget

    ref = torch.linspace(-2, 2, 1000, dtype=torch.float64)
    out = ref + 1e-9
    kept_ref, kept_out = ref.clone(), out.clone()
    assert compare_trials([[ref]], [[out]]).correct
    eager = eager_errors([[ref.float()]], [[ref]])
    problems, err, _ = precision_budget(eager, [[ref]], [[out]], "fp32")
    assert not problems and err > 0
    assert torch.equal(ref, kept_ref) and torch.equal(out, kept_out)


def test_fast_and_masked_paths_agree():
    torch.manual_seed(0)
    ref = torch.randn(4096)
    out = ref + 1e-3 * torch.randn(4096)
    out[0] = ref[0]  # the element the masked twin replaces by a shared infinity
    fast = compare_trials([[ref]], [[out]], norm_from=1)
    ref_inf, out_inf = ref.clone(), out.clone()
    ref_inf[0] = out_inf[0] = float("inf")  # one shared infinity: the masked path
    masked = compare_trials([[ref_inf]], [[out_inf]], norm_from=1)
    assert fast.correct == masked.correct
    assert abs(fast.max_abs_error - masked.max_abs_error) < 1e-6
    assert fast.reasons and "elements outside" in fast.reasons[0]
    assert masked.reasons[0].split(" of ")[0] == fast.reasons[0].split(" of ")[0]


def _cancelling_rows(seed: int) -> torch.Tensor:
    """Rows of large terms that nearly cancel: small sums carrying their terms' rounding."""
    g = torch.Generator().manual_seed(seed)
    a = 30 * torch.randn(64, 4096, generator=g)
    return torch.cat([a, -a[:, torch.randperm(4096, generator=g)]], 1) + torch.randn(
        64, 8192, generator=g)


def test_eager_slack_lets_another_summation_order_pass_where_terms_cancel():
    from cuda_agent.judge.compare import PRECISION_FACTOR, eager_errors, slack_of, timed_slack

    x = _cancelling_rows(0)
    ref, ref64 = x.sum(1), x.double().sum(1)
    other = x.reshape(64, 64, 128).sum(2).sum(1)  # the same sums in another order
    eager = eager_errors([[ref]], [[ref64]])
    slack = slack_of(eager, "fp32")
    assert slack[0][0] == pytest.approx(PRECISION_FACTOR * float((ref - ref64).abs().max()))
    assert eager[0][0].rel == pytest.approx(float((ref - ref64).norm() / ref64.norm()))
    assert timed_slack(eager, [1.0], "fp32") == slack[0]
    assert not compare_trials([[ref]], [[other]], norm_from=1).correct  # without: rejected
    assert compare_trials([[ref]], [[other]], norm_from=1, slack=slack).correct
    wrong = other.clone()
    wrong[7] += 0.1  # a wrong element is still a wrong element
    result = compare_trials([[ref]], [[wrong]], norm_from=1, slack=slack)
    assert not result.correct and "rounding allowance" in result.reasons[0]


def test_eager_slack_without_twins_and_for_timed_sets():
    from cuda_agent.judge.compare import eager_errors, slack_of, timed_slack

    ref = torch.ones(3)
    twin = ref.double() + torch.tensor([0.0, 1e-3, 0.0], dtype=torch.float64)
    eager = eager_errors([[ref], [ref], [ref]], [[twin], [twin]])
    slack = slack_of(eager, "fp32")
    assert len(slack) == 2 and slack[1][0] > 0.0  # the third trial has no twin
    off = compare_trials([[ref]] * 3, [[ref + 1e-3]] * 3, norm_from=3, slack=slack)
    assert off.reasons[0].startswith("trial 2, output 0: 3 of 3 elements")  # ... so no slack
    assert timed_slack(eager, [1.0, 4.0, 1.0], "fp32") == slack[0]  # scale-1 trials'
    assert eager_errors([[ref]], None) == []
    assert slack_of(eager_errors([[torch.arange(3)]], [[torch.arange(3)]]), "fp32") == [[0.0]]
    assert timed_slack(eager, [4.0, 4.0, 1.0], "fp32") == []


def test_slack_at_a_declared_precision_covers_terms_rounded_to_it():
    """Autocast sums in fp32, so eager's own error says nothing of a bf16 candidate's:
    the slack's floor is the precision budget's floor times the output's root mean square."""
    from cuda_agent.judge.compare import PRECISION_FLOOR, eager_errors, slack_of

    x = torch.randn(64, 8192, generator=torch.Generator().manual_seed(3))
    ref, ref64 = x.sum(1), x.double().sum(1)
    eager = eager_errors([[ref]], [[ref64]])
    rms = float(ref64.square().mean().sqrt())
    assert eager[0][0].rms == pytest.approx(rms)
    assert slack_of(eager, "bf16")[0][0] == pytest.approx(PRECISION_FLOOR["bf16"] * rms)
    assert slack_of(eager, "fp32")[0][0] < 1e-3 < slack_of(eager, "bf16")[0][0]
    terms = x.bfloat16().float().reshape(64, 64, 128).sum(2).sum(1)  # another order, too
    worst = float((terms.double() - ref64).abs().max())
    assert worst > 5e-2  # rows near zero: outside bf16's atol on their own
    assert compare_trials([[ref]], [[terms]], 5e-2, 5e-2, norm_from=1,
                          slack=slack_of(eager, "bf16")).correct
    wrong = terms.clone()
    wrong[int(ref.abs().argmin())] += 4.0  # a wrong row sum is still wrong
    assert not compare_trials([[ref]], [[wrong]], 5e-2, 5e-2, norm_from=1,
                              slack=slack_of(eager, "bf16")).correct
    nan = torch.tensor([1.0, float("nan"), 3.0])  # the mean square over finite elements
    assert eager_errors([[nan]], [[nan.double()]])[0][0].rms == pytest.approx(5.0 ** 0.5)
