"""Degenerate kinds refused by running the task, and verdicts near a threshold refused as
``borderline``: each case is accepted once its check is turned off or widened, so the
check named is what refuses it."""

from __future__ import annotations

import pytest

from cuda_agent.synth.filters import SKIPPED, Checker
from tests.synth.conftest import GOOD, task
from tests.tasks.degenerate_cases import CASES

MOSTLY_CONSTANT = {
    # average pooling then round: 99.5% zeros (a zero answer fails only the +-1 elements)
    "pool_round": CASES["pool_round_sparse"].code,
    # a ReLU whose bias leaves 0.6% of the elements alive
    "relu_shifted": task("return torch.relu(x - 2.5) * 3.0"),
    # a threshold that zeroes all but 0.5% of the elements, plus noise far below atol
    "threshold": task("return torch.nn.functional.threshold(x, 2.6, 0.0) + x * 1e-4"),
}
UNCHANGED = {
    # matrix product of one matrix: a copy, which the ATen trace does not judge
    "chain_matmul": task("y = torch.chain_matmul(x)\nreturn torch.tanh(y) * 2 + 1"),
    # padding by nothing, squeezing without a size-1 dimension, one block on the diagonal
    "pad_nothing": task("y = torch.nn.functional.pad(x, (0, 0))\nreturn torch.tanh(y) * 3"),
    "squeeze": task("y = torch.squeeze(x)\nreturn torch.sigmoid(y @ x.T)"),
    "block_diag": task("y = torch.block_diag(x)\nreturn torch.sigmoid(y @ x.T)"),
}
BORDERLINE = {
    # the case: one repeated value passes at 1e-2 on most draws; the judge's own
    # tolerance (1e-4) it fails, so ``not_degenerate`` alone would accept it
    "norm_except_dim": (CASES["norm_except_dim"].code, "not_degenerate"),
    # a standard deviation over 4096 values: two draws differ by 1.7x the tolerance
    "row_std": (task("return x.std(dim=1) + torch.tanh(x[:, :1]).squeeze(1) * 1e-3",
                     "torch.randn(64, 4096)"), "not_constant"),
}


@pytest.mark.parametrize("name", sorted(MOSTLY_CONSTANT))
def test_mostly_constant_output_is_refused(pool, fast_filters, name):
    verdict = Checker(fast_filters, "cpu", pool).check(MOSTLY_CONSTANT[name])
    assert verdict.checks["not_mostly_constant"] is False, verdict.reasons
    assert verdict.metrics["constant_share"] >= 0.95
    assert verdict.reason_codes == ("not_mostly_constant",), verdict.reasons
    off = fast_filters.model_copy(update={"max_constant_share": 1.0,
                                          "constant_share_margin": 0.0})
    assert Checker(off, "cpu", pool).check(MOSTLY_CONSTANT[name]).accepted


@pytest.mark.parametrize("name", sorted(UNCHANGED))
def test_statement_returning_its_input_is_refused(pool, fast_filters, name):
    verdict = Checker(fast_filters, "cpu", pool).check(UNCHANGED[name])
    assert verdict.reason_codes == ("no_redundant_ops",), verdict.reasons
    assert "returns its input unchanged" in verdict.reasons[0]
    assert any(f.startswith("`y = ") for f in verdict.metrics["redundant_ops"]), verdict.metrics
    off = fast_filters.model_copy(update={"redundant_ops": False})
    assert Checker(off, "cpu", pool).check(UNCHANGED[name]).accepted


@pytest.mark.parametrize("name", sorted(BORDERLINE))
def test_near_threshold_is_refused_as_borderline(pool, fast_filters, name):
    code, check = BORDERLINE[name]
    verdict = Checker(fast_filters, "cpu", pool).check(code)
    assert not verdict.accepted and verdict.checks[check] is False
    assert f"borderline: {check}: " in "\n".join(verdict.reasons), verdict.reasons
    assert not any(r.startswith(f"{check}:") for r in verdict.reasons)  # passed, but close
    if check == "not_degenerate":  # the judge's rule alone, at the judge's tolerance
        assert verdict.metrics["degenerate_trials"] == 1  # failed its first draw
        return
    wide = fast_filters.model_copy(update={"borderline_factor": 1.0})
    again = Checker(wide, "cpu", pool).check(code)
    assert not any(r.startswith(f"borderline: {check}") for r in again.reasons)
    assert again.checks[check] is True


def test_runtime_near_the_window_is_borderline(pool, fast_filters):
    """Every time lies within a factor of a million of the window's edges."""
    near = fast_filters.model_copy(update={"borderline_time_factor": 1e6})
    verdict = Checker(near, "cpu", pool).check(GOOD)
    assert verdict.checks["runtime_window"] is False
    assert verdict.reasons[0].startswith("borderline: runtime_window: eager runtime")
    assert Checker(fast_filters, "cpu", pool).check(GOOD).accepted


def test_kernelbench_similarity_near_the_threshold_is_borderline(pool, fast_filters,
                                                                 kernelbench):
    relu = task("return torch.relu(x)")
    score = Checker(fast_filters, "cpu", pool, kernelbench).check(
        relu, short_circuit=True).metrics["kernelbench_similarity"]
    just_above = fast_filters.model_copy(update={"similarity_threshold": score + 0.01})
    verdict = Checker(just_above, "cpu", pool, kernelbench).check(relu, short_circuit=True)
    assert verdict.checks["not_kernelbench_copy"] is False
    assert verdict.reasons[0].startswith("borderline: not_kernelbench_copy")


def test_without_kernelbench_the_check_reads_skipped(pool, fast_filters):
    verdict = Checker(fast_filters, "cpu", pool, kernelbench=None).check(GOOD)
    assert verdict.checks["not_kernelbench_copy"] == SKIPPED
    assert verdict.accepted and verdict.skipped == ("not_kernelbench_copy",)


def test_kernelbench_is_found_where_the_project_keeps_it(tmp_path, monkeypatch):
    from cuda_agent.synth.filters import find_kernelbench

    copy = tmp_path / "shared" / "kernelbench" / "kernelbench.jsonl"
    copy.parent.mkdir(parents=True)
    copy.write_text("")
    (tmp_path / "checkout").mkdir()
    monkeypatch.chdir(tmp_path / "checkout")
    assert find_kernelbench("auto") == copy.resolve()
    assert find_kernelbench(None) is None
    assert find_kernelbench(copy) == copy
