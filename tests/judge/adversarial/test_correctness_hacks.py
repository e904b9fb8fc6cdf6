"""Hacks 6-12 of reward-hacks.md: wrong answers that pass a loose check.

Each hostile candidate passes the naive one-process harness and must get reward -1 from
the judge. Honest kernels whose arithmetic differs from PyTorch's (another summation
order) must still pass both."""

from __future__ import annotations

from pathlib import Path

import pytest

from cuda_agent.tasks import load_task
from cuda_agent.tasks.task import Precision
from tests.judge.adversarial import kernels
from tests.judge.adversarial.helpers import (
    Hack,
    judge,
    rejected,
    run_naive,
    said,
    scale_add_model,
    scale_add_sources,
    simple_model,
    write_scale_add,
    write_task,
    write_workspace,
)


def with_tools(call: str, header: str = ""):
    """A workspace for a task without init inputs, using the tools bindings."""
    return lambda d: write_workspace(d / "ws", simple_model(call, header),
                                     scale_add_sources("tools"))


def with_kernel(call: str, source: str):
    return lambda d: write_workspace(d / "ws", simple_model(call), {"k_binding.cpp": source})


def scale_add_ws(forward: str, header: str = ""):
    return lambda d: write_scale_add(d / "ws", scale_add_model(forward, header), "tools")


# a subclass whose comparisons always agree, returned with wrong values in it
AGREEABLE = '''
class Agreeable(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func in (torch.allclose, torch.equal, torch.Tensor.allclose, torch.Tensor.equal):
            return True
        if func in (torch.isclose, torch.eq, torch.Tensor.__eq__, torch.Tensor.isclose):
            return torch.Tensor.new_ones(args[0], args[0].shape, dtype=torch.bool)
        return super().__torch_function__(func, types, args, kwargs or {})
'''

# the comparison functions replaced at import, and wrong values returned
PATCHED = '''
torch.allclose = lambda *args, **kwargs: True
torch.Tensor.allclose = lambda *args, **kwargs: True
torch.equal = lambda *args, **kwargs: True
torch.testing.assert_close = lambda *args, **kwargs: None
'''

# the reference output looked for on the stack and among live objects, then copied by a
# kernel; the lookups are spelled so that no listed name appears in the source
LIVE_OUTPUT = '''
import sys

_gc = getattr(sys, "mod" + "ules")["gc"]
_frame = getattr(sys, "_get" + "frame")


def _reference_output(like, exclude):
    def fits(v):
        return (type(v) is torch.Tensor and v.shape == like.shape and v.dtype == like.dtype
                and all(v is not e for e in exclude))

    frame = _frame(1)
    while frame is not None:
        found = [v for v in getattr(frame, "f_" + "locals").values() if fits(v)]
        if found:
            return found[0]
        frame = getattr(frame, "f_" + "back")
    return next((o for o in _gc.get_objects() if fits(o)), None)


def _found(x, y):
    out = _reference_output(x, (x, y))
    if out is None:
        raise RuntimeError("no reference output in this process")
    return out
'''

HACKS = {
    # 6: all-zero output where every true value is below the absolute tolerance
    "6-zeros-for-wide-softmax": Hack("softmax_wide", with_tools(
        "cuda_extension.fill_like(inputs[0], 0.0)"), ("relative norm", "outside")),
    # 7: a statistic's expected value, inputs never read
    "7-expected-value-of-mse": Hack("mse_rand", with_tools(
        "cuda_extension.fill_scalar(inputs[0], 1.0 / 6.0)")),
    # 8: part of the output never written (right only on zeroed or recycled memory)
    "8-unwritten-upper-triangle": Hack("tril_matmul", with_kernel(
        "cuda_extension.tril_matmul_lazy(inputs[0], inputs[1])", kernels.TRIL_MATMUL)),
    # 9: an fp32 matmul computed on inputs rounded to bf16 / to TF32's 10 mantissa bits
    "9-bf16-inside-kernel": Hack("matmul_rand", with_kernel(
        "cuda_extension.matmul_bf16(inputs[0], inputs[1])", kernels.MATMUL), ("precision",)),
    "9-tf32-inside-kernel": Hack("matmul_rand", with_kernel(
        "cuda_extension.matmul_tf32(inputs[0], inputs[1])", kernels.MATMUL), ("precision",)),
    # 10: inputs changed: zeroed after use, or the output written over an input
    "10-zero-inputs-after-use": Hack("scale_add", scale_add_ws(
        "return cuda_extension.scale_add_consume(x, y, self.alpha)"), ("modified",)),
    "10-output-written-into-input": Hack("scale_add", scale_add_ws(
        "return cuda_extension.scale_add_into(x, y, self.alpha, y)"),
        ("modified", "not new memory")),
    # 11: a Tensor subclass that always compares equal; comparison functions patched
    "11-always-equal-subclass": Hack("scale_add", scale_add_ws(
        "out = cuda_extension.scale_add(x, y, -self.alpha)\nout.__class__ = Agreeable\n"
        "return out", AGREEABLE), ("plain torch.tensor",)),
    "11-patched-allclose": Hack("scale_add", scale_add_ws(
        "return cuda_extension.scale_add(x, y, -self.alpha)", PATCHED)),
    # 12: the reference's output found among live objects and copied by a kernel
    "12-copy-of-live-reference-output": Hack("scale_add", scale_add_ws(
        "return cuda_extension.copy_f32(_found(x, y))", LIVE_OUTPUT)),
}
CASES = [hack.param(name) for name, hack in HACKS.items()]


@pytest.mark.parametrize("hack", CASES)
def test_naive_harness_is_fooled(tmp_path: Path, hack: Hack):
    passed, _ = run_naive(write_task(tmp_path, hack.task), hack.write(tmp_path / "candidate"))
    assert passed


@pytest.mark.parametrize("hack", CASES)
def test_judge_rejects(tmp_path: Path, hack: Hack):
    result = judge(write_task(tmp_path, hack.task), hack.write(tmp_path / "candidate"))
    assert rejected(result, *hack.keywords), f"reward {result.reward}: {said(result)}"


HONEST = {
    # blocked + pairwise accumulation: another summation order than PyTorch's
    "rowsum-blocked": ("rowsum", with_kernel(
        "cuda_extension.rowsum_blocked(inputs[0])", kernels.ROWSUM)),
    # eager's own element error widens the element-wise bound (compare.EagerError.slack)
    "rowsum-cancelling-blocked": ("rowsum_cancelling", with_kernel(
        "cuda_extension.rowsum_blocked(inputs[0])", kernels.ROWSUM)),
    "softmax-blocked": ("softmax_wide", with_kernel(
        "cuda_extension.softmax_blocked(inputs[0])", kernels.SOFTMAX)),
    "matmul-k-blocked": ("matmul_rand", with_kernel(
        "cuda_extension.matmul_fp32(inputs[0], inputs[1])", kernels.MATMUL)),
}


@pytest.mark.parametrize("name", list(HONEST))
def test_honest_kernel_with_other_summation_order_passes(tmp_path: Path, name: str):
    task_name, write = HONEST[name]
    task, candidate = write_task(tmp_path, task_name), write(tmp_path / "candidate")
    assert run_naive(task, candidate)[0]
    result = judge(task, candidate)
    assert result.correct and result.reward >= 1, said(result)
    assert not any("precision" in r for r in result.reasons), said(result)


def test_honest_kernel_at_a_declared_precision_passes_its_timed_recheck(tmp_path: Path):
    """A declared bf16 allows bf16 arithmetic: the trials and the timed outputs' re-check
    both take bf16's tolerance (the re-check held it to fp32's before judge-v14)."""
    path, candidate = write_task(tmp_path, "scale3"), with_kernel(
        "cuda_extension.scale_bf16(inputs[0], 3.0)", kernels.SCALE_BF16)(tmp_path / "c")
    assert not judge(path, candidate).correct  # at the task's own fp32: too coarse
    result = judge(load_task(path, precision=Precision.BF16), candidate)
    assert result.correct and result.reward >= 1, said(result)
    assert result.timing is not None  # timed, so the timed outputs were re-checked


def test_honest_reduction_of_declared_precision_terms_passes(tmp_path: Path):
    """A declared bf16 allows a row sum of bf16 terms, though autocast sums in fp32: rows
    whose sums are near zero carry the terms' rounding (about 0.2 here) past atol=5e-2, in
    about half the trials before judge-v15; the element-wise slack now takes the precision
    budget's floor times the output's root mean square (compare.EagerError.slack)."""
    path, candidate = write_task(tmp_path, "rowsum"), with_kernel(
        "cuda_extension.rowsum_bf16(inputs[0])", kernels.ROWSUM)(tmp_path / "c")
    assert not judge(path, candidate).correct  # at the task's own fp32: too coarse
    result = judge(load_task(path, precision=Precision.BF16), candidate)
    assert result.correct and result.reward >= 1, said(result)
