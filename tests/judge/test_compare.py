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


# --- the precision budget grows with the reduction's length (judge.fan_in) -----------------

class RowSum(torch.nn.Module):
    def forward(self, x):
        return x.sum(1)


class MatMul(torch.nn.Module):
    def forward(self, a, b):
        return a @ b


def _rounded(x: torch.Tensor, bits: int) -> torch.Tensor:
    """``x`` with ``bits`` mantissa bits, rounded to nearest even (10: TF32, 7: bf16)."""
    drop = 23 - bits
    u = x.contiguous().view(torch.int32)
    u = (u + ((1 << (drop - 1)) - 1) + ((u >> drop) & 1)) & ~((1 << drop) - 1)
    return u.view(torch.float32)


def _serial(terms: torch.Tensor) -> torch.Tensor:
    """Sums over the last dim, one term after another in fp32 (numpy's cumsum is sequential)."""
    return torch.from_numpy(terms.numpy().cumsum(axis=-1, dtype="float32")[..., -1].copy())


def _judged(model: torch.nn.Module, inputs: list[torch.Tensor], fan_in: bool = True):
    """(eager errors with or without the fan-in report, float64 output, eager output)."""
    from cuda_agent.judge.compare import eager_errors
    from cuda_agent.judge.fan_in import report

    wide = [x.double() for x in inputs]
    ref64, eager = model.double()(*wide), model.float()(*inputs)
    reported = report(model.double(), wide) if fan_in else None
    return eager_errors([[eager]], [[ref64]], reported), ref64, eager


def test_long_serial_fp32_reduction_passes_where_low_precision_terms_fail():
    """131072 normal terms per row summed one after another: ordinary fp32 rounding, about
    u sqrt(n/2) = 1.6e-5 from float64, three times the old fixed floor (5e-6); the same
    terms rounded to TF32 or bf16 stay outside the budget that grows with n."""
    from cuda_agent.judge.compare import precision_budget, slack_of

    x = torch.randn(32, 131072, generator=torch.Generator().manual_seed(11))
    errors, ref64, eager = _judged(RowSum(), [x])
    fixed, _, _ = _judged(RowSum(), [x], fan_in=False)
    serial = _serial(x)
    assert errors[0][0].terms == 131072 and errors[0][0].allowance > 5e-6
    old, err, _ = precision_budget(fixed, [[ref64]], [[serial]], "fp32")
    assert old and old[0].startswith("precision"), old  # the fixed floor refuses it
    new, _, budget = precision_budget(errors, [[ref64]], [[serial]], "fp32")
    assert not new and err < budget / 2, (new, err, budget)
    assert compare_trials([[eager]], [[serial]], norm_from=1,
                          slack=slack_of(errors, "fp32")).correct
    for bits in (10, 7):  # TF32, bf16 terms, summed exactly
        low = _rounded(x, bits).double().sum(1).float()
        problems, _, _ = precision_budget(errors, [[ref64]], [[low]], "fp32")
        assert problems and problems[0].startswith("precision"), (bits, problems)
        assert "131072 terms" in problems[0]


def test_serial_gemm_passes_while_tf32_and_bf16_inputs_fail():
    """A GEMM with K = 16384 done as one fp32 dot product per output, as a naive kernel
    does, passes; the product of TF32- or bf16-rounded inputs (a tensor core's) fails."""
    from cuda_agent.judge.compare import precision_budget

    g = torch.Generator().manual_seed(12)
    a, b = torch.randn(16, 16384, generator=g), torch.randn(16384, 16, generator=g)
    errors, ref64, _ = _judged(MatMul(), [a, b])
    assert errors[0][0].terms == 16384
    serial = _serial(a[:, None, :] * b.T[None, :, :])  # (16, 16, K) products, in order
    assert not precision_budget(errors, [[ref64]], [[serial]], "fp32")[0]
    for bits in (10, 7):
        low = (_rounded(a, bits).double() @ _rounded(b, bits).double()).float()
        problems, err, budget = precision_budget(errors, [[ref64]], [[low]], "fp32")
        assert problems and err > 10 * budget, (bits, err, budget)


class Models:
    """Small float64 models whose reductions are known."""

    class Elementwise(torch.nn.Module):
        def forward(self, x):
            return x * 2.0 + 1.0

    class ReluLinear(torch.nn.Module):
        def forward(self, x, w):
            return torch.relu(x @ w)

    class Softmax(torch.nn.Module):
        def forward(self, x):
            return torch.softmax(x, dim=1)

    class Total(torch.nn.Module):
        def forward(self, x):
            return x.sum()

    class Argmax(torch.nn.Module):
        def forward(self, x):
            return x.argmax(1), x.sum(1)

    class NoGrad(torch.nn.Module):
        def forward(self, x):
            with torch.no_grad():
                return x.sum(1)

    class InPlace(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(40, dtype=torch.float64))

        def forward(self, x):
            return x.mul_(self.w).sum(1)


def test_fan_in_counts_the_terms_each_output_element_combines():
    from cuda_agent.judge.fan_in import measure

    g = torch.Generator().manual_seed(13)

    def normal(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    (mm,) = measure(MatMul(), [normal(8, 300), normal(300, 5)])
    assert (mm.n, mm.lanes) == (300, 8) and 0.2 < mm.rho < 5  # zero-mean terms: about 1
    (rows,) = measure(RowSum(), [normal(6, 1000)])
    assert (rows.n, rows.lanes) == (1000, 6)
    (positive,) = measure(RowSum(), [normal(6, 1000).abs()])
    assert positive.rho < 0.01  # terms of one sign: about 1/n
    cancelling = torch.cat([30 * normal(6, 500), -30 * normal(6, 500)], 1)
    cancelling[:, 500:] = -cancelling[:, :500].flip(1)
    (cancel,) = measure(RowSum(), [cancelling + normal(6, 1000)])
    assert cancel.rho > 100
    (one,) = measure(Models.Elementwise(), [normal(4, 10)])
    assert (one.n, one.lanes) == (1, 40)
    (relu,) = measure(Models.ReluLinear(), [normal(16, 64), normal(64, 32)])
    assert relu.n == 64  # the largest output is active; zeroed ones count nothing
    (soft,) = measure(Models.Softmax(), [normal(3, 500)])
    assert (soft.n, soft.lanes) == (500, 3)  # a row's elements share one sum
    (total,) = measure(Models.Total(), [normal(7, 9)])
    assert (total.n, total.lanes) == (63, 1)
    index, summed = measure(Models.Argmax(), [normal(5, 20)])
    assert index is None and summed.n == 20
    assert measure(Models.NoGrad(), [normal(5, 20)]) == [None]
    assert measure(RowSum(), [torch.arange(6).reshape(2, 3)]) is None  # nothing to vary


def test_fan_in_leaves_inputs_and_model_as_they_were():
    from cuda_agent.judge.fan_in import measure

    model, x = Models.InPlace().double(), torch.randn(3, 40, dtype=torch.float64)
    kept = x.clone()
    (fan,) = measure(model, [x])
    assert fan.n == 40 and torch.equal(x, kept)  # in-place work on a copy, not on x
    assert all(p.requires_grad for p in model.parameters())


def test_allowance_rule():
    """A scalar sum gets more spread than many lanes; the cap bounds n; a trial whose
    output came out smaller than where the fan-in was measured gets more cancellation."""
    from cuda_agent.judge.fan_in import (
        FAN_IN_CAP,
        NORM_SPREAD,
        ROUNDING_UNIT,
        FanIn,
        allowance,
        rounding,
        spread,
    )

    assert spread(1) > 3 > spread(2) > spread(4) == spread(10**6) == NORM_SPREAD
    assert rounding(1 << 16, 1.0) == pytest.approx(ROUNDING_UNIT * (65536 / 2) ** 0.5)
    assert rounding(FAN_IN_CAP * 64, 1.0) == rounding(FAN_IN_CAP, 1.0)
    fan = FanIn(n=4096, rho=1.0, mean_square=4096.0, lanes=64)
    norm, element = allowance(fan, 4096.0)
    assert norm == pytest.approx(NORM_SPREAD * rounding(4096, 1.0))
    assert element > norm
    assert allowance(fan, 4096.0 / 100)[0] > 5 * norm  # the same terms, a value 10x smaller
    assert allowance(fan, 4096.0 * 100)[0] == norm  # never less than where measured


def test_scalar_sum_smaller_than_usual_keeps_its_terms_rounding():
    """A scalar sum of zero-mean terms comes out as small as chance makes it; its terms, and
    their rounding, do not shrink with it: the cancellation measured on a typical draw
    grows with how much smaller the trial's value is. Here a serial sum of 2^20 terms whose
    value is 1/100 of the typical one errs more than 16 x eager's error and more than the
    allowance measured, and passes by the raised one."""
    from cuda_agent.judge.compare import _errors, eager_errors, precision_budget
    from cuda_agent.judge.fan_in import FanIn, allowance, report

    g = torch.Generator().manual_seed(18)
    typical = torch.randn(1 << 20, generator=g)
    small = torch.randn(1 << 20, generator=g).double()
    small = (small - small.mean() + typical.double().mean() / 100).float()
    reported = report(Models.Total().double(), [typical.double()])
    refs = [[x.sum()] for x in (typical, small)]
    wides = [[x.double().sum()] for x in (typical, small)]
    errors = eager_errors(refs, wides, reported)
    serial = [[_serial(x)] for x in (typical, small)]
    err = _errors(serial[1][0], wides[1][0])[0]
    fan = FanIn.decode(reported[0])
    assert err > 16 * errors[1][0].rel and err > allowance(fan, fan.mean_square)[0]
    assert not precision_budget(errors, wides, serial, "fp32")[0]


def test_fan_in_report_is_decoded_defensively():
    from cuda_agent.judge.compare import eager_errors

    ref = torch.randn(10)
    for bad in (None, "x", [[1, 2]], [[-1, 0.5, 1.0, 1]], [[1, float("nan"), 1.0, 1]],
                [[True, 0.5, 1.0, 1]], [[1, 0.5, float("inf"), 1]], {"n": 3}):
        errors = eager_errors([[ref]], [[ref.double()]], bad)
        assert errors[0][0].allowance == 0.0 and errors[0][0].element_allowance == 0.0, bad
    good = eager_errors([[ref]], [[ref.double()]], [[1000, 1.0, 1.0, 10]])
    assert good[0][0].allowance > 0 and good[0][0].terms == 1000
