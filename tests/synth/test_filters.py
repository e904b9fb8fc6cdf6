"""Each filter rejects a crafted bad task with its named reason and accepts a good one."""

from __future__ import annotations

import pytest

from cuda_agent.synth.filters import CHECKS, Checker
from tests.synth.conftest import GOOD, task

BAD = {
    "not_identity": task("return torch.relu(x)", inputs="torch.rand(64, 256)"),
    "not_constant": task("return torch.softmax(x[:, :1], dim=1)"),
    "not_near_zero": task("return x * 1e-6"),
    "sensitive_to_inputs": task("return torch.tanh(x) + 0 * y", args="x, y",
                                inputs="torch.randn(64, 256), torch.randn(64, 256)"),
    "no_stochastic_ops": task("return torch.nn.functional.dropout(x, 0.5, training=True)"),
    "finite": task("return torch.log(x)"),
    "deterministic": task("import time\nreturn x * (time.perf_counter_ns() % 997)"),
    "no_redundant_ops": task("y = torch.relu(x)\nreturn torch.nn.functional.leaky_relu(y) "
                             "* 3.0 + x"),
    "runs_eager": task("return x @ x"),
    "builds": task("return x", init="        self.w = nn.Linear(3)"),
}


@pytest.mark.parametrize("check", sorted(BAD))
def test_filter_rejects_crafted_task_with_named_reason(pool, fast_filters, check):
    verdict = Checker(fast_filters, "cpu", pool).check(BAD[check])
    assert not verdict.accepted
    assert verdict.checks[check] is False
    assert any(r.startswith(check) for r in verdict.reasons), verdict.reasons


def test_good_task_passes_every_filter(pool, fast_filters):
    verdict = Checker(fast_filters, "cpu", pool).check(GOOD)
    assert verdict.accepted, verdict.reasons
    assert set(verdict.checks) == set(CHECKS) and all(verdict.checks.values())
    assert verdict.eager_ms is not None and verdict.output_shapes == ((64, 64),)


@pytest.mark.serial
def test_runtime_window(pool, fast_filters):
    tight = fast_filters.model_copy(update={"min_ms_cpu": 5_000.0})
    verdict = Checker(tight, "cpu", pool).check(GOOD)
    assert verdict.reason_codes == ("runtime_window",)
    assert any("runtime" in name and not ok for name, ok in verdict.checks.items())


def test_hang_is_a_timeout_not_a_stall(pool, fast_filters):
    hang = task("import time\ntime.sleep(60)\nreturn x")
    verdict = Checker(fast_filters.model_copy(update={"task_timeout_s": 3}), "cpu",
                      pool).check(hang)
    assert not verdict.accepted and verdict.reason_codes == ("timeout",)
    assert Checker(fast_filters, "cpu", pool).check(GOOD).accepted  # the pool recovered


def test_kernelbench_near_copy_and_duplicate(pool, fast_filters, kernelbench):
    checker = Checker(fast_filters, "cpu", pool, kernelbench=kernelbench)
    relu = task("return torch.relu(x)")
    verdict = checker.check(relu, short_circuit=True)
    assert verdict.checks["not_kernelbench_copy"] is False
    assert "19_ReLU" in verdict.metrics["kernelbench_nearest"]
    assert checker.check(GOOD).checks["not_kernelbench_copy"]
    checker.claim(GOOD, "first")
    renamed = GOOD.replace("x", "inp").replace("256", "128")
    dup = checker.check(renamed, name="second", short_circuit=True)
    assert dup.reason_codes == ("not_duplicate",)


def test_catalog_stochastic_tag_is_a_static_rejection(pool, fast_filters):
    checker = Checker(fast_filters, "cpu", pool, stochastic_ops={"nn.Dropout"})
    verdict = checker.check(GOOD, ops=("nn.Dropout",), short_circuit=True)
    assert verdict.checks["no_stochastic_ops"] is False


@pytest.mark.slow
def test_torch_compile_check_runs(pool, fast_filters):
    """The one test that really compiles (5-30 s on CPU)."""
    verdict = Checker(fast_filters.model_copy(update={"compile_check": True}), "cpu",
                      pool).check(task("return torch.tanh(x) * 2.0 + 1.0"))
    assert verdict.checks["runs_compiled"], verdict.reasons
    assert verdict.compile_ms is not None


def test_a_killed_worker_is_explained():
    import signal

    from cuda_agent.synth.runner import _died

    assert "out of memory" in _died(-signal.SIGKILL, "(no output)")
    assert "SIGSEGV" in _died(-signal.SIGSEGV, "x")
    assert "exited with code 2" in _died(2, "boom")
