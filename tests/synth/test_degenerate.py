"""``not_degenerate``: synthesis refuses a task whose output a trivial answer passes at every
trial, with the reason named, where the filters that compare two draws accept it; honest
near-misses pass."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cuda_agent.synth.filters import Checker
from tests.synth.conftest import GOOD
from tests.tasks.degenerate_cases import CASES, task

ONLY_DEGENERATE = ("constant", "repeated", "flattened")
"""Cases every filter but ``not_degenerate`` (and ``not_mostly_constant``, which sees the
same one value on one draw) accepts."""


@pytest.mark.parametrize("name", ONLY_DEGENERATE)
def test_refused_only_as_degenerate(pool, fast_filters, name):
    case = CASES[name]
    verdict = Checker(fast_filters, "cpu", pool).check(case.code)
    assert not verdict.accepted
    assert verdict.reason_codes[0] == "not_degenerate", verdict.reasons
    assert set(verdict.reason_codes) <= {"not_degenerate", "not_mostly_constant"}
    assert verdict.reasons[0].startswith(f"not_degenerate: {case.reason}"), verdict.reasons
    assert verdict.reasons[0].endswith("at every trial (7 of 7)")
    assert verdict.metrics["degenerate_trials"] == 7


def test_identity_matmul_of_one_matrix_is_named(pool, fast_filters):
    verdict = Checker(fast_filters, "cpu", pool).check(CASES["chain_matmul"].code)
    assert verdict.checks["not_degenerate"] is False
    assert any(r.startswith(f"not_degenerate: {CASES['chain_matmul'].reason}")
               for r in verdict.reasons), verdict.reasons


@pytest.mark.parametrize("name", ["relu_signed", "softmax_short_row", "pool_round_sparse",
                                  "elu_in_place"])
def test_near_miss_is_not_degenerate(pool, fast_filters, name):
    verdict = Checker(fast_filters, "cpu", pool).check(CASES[name].code)
    assert verdict.checks["not_degenerate"] is True, verdict.reasons
    assert not any(r.startswith("not_degenerate") for r in verdict.reasons)
    assert verdict.metrics["degenerate_trials"] == 1  # every answer failed the first draw


def test_scaled_draws_count(pool, fast_filters):
    """Without the scaled draws a constant answer would pass: they are what fails it."""
    # 0.5 everywhere at x1 and x4; at x0.25 the inputs lie below 0.5 and come through
    pinned = task("return torch.tanh(x), torch.clamp(x, max=0.5)", "torch.rand(64, 256) + 1.0")
    fresh_only = fast_filters.model_copy(update={"degenerate_scales": ()})
    assert Checker(fresh_only, "cpu", pool).check(pinned).checks["not_degenerate"] is False
    verdict = Checker(fast_filters, "cpu", pool).check(pinned)
    assert verdict.checks["not_degenerate"] is True, verdict.reasons


@pytest.mark.slow
def test_synth_check_refuses_a_degenerate_task(tmp_path):
    bad, good = tmp_path / "constant.py", tmp_path / "good.py"
    bad.write_text(CASES["constant"].code)
    good.write_text(GOOD)
    window = ["--no-compile", "--set", "min_ms_cpu=0", "--json"]
    run = [sys.executable, "-m", "cuda_agent", "synth", "check"]
    refused = subprocess.run([*run, str(bad), *window], capture_output=True, text=True,
                             timeout=180)
    assert refused.returncode == 1, refused.stderr
    verdict = json.loads(refused.stdout)
    assert verdict["checks"]["not_degenerate"] is False
    assert verdict["filter_version"] == "synth-filters-v3"
    assert verdict["reasons"][0] == (f"not_degenerate: {CASES['constant'].reason} at every "
                                     "trial (7 of 7)")
    accepted = subprocess.run([*run, str(good), *window], capture_output=True, text=True,
                              timeout=180)
    assert accepted.returncode == 0, accepted.stderr
    assert json.loads(accepted.stdout)["checks"]["not_degenerate"] is True
