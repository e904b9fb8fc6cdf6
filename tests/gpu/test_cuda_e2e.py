"""The CUDA path end to end; run on a GPU machine with ``pytest -m gpu``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cuda_agent.build import BuildConfig, Builder, load_extension
from cuda_agent.judge import Candidate, Judge, JudgeConfig
from cuda_agent.tasks import load_task
from cuda_agent.workspace import init_workspace

pytestmark = pytest.mark.gpu


def test_example_kernel_builds_and_runs(tmp_path: Path):
    root = init_workspace(load_task("builtin:gelu_bias_scale"), tmp_path / "ws", "cuda")
    result = Builder(BuildConfig(device="cuda")).build(root)
    assert result.ok, result.log
    ext = load_extension(result.extension_path)
    x, y = torch.randn(1000, 3, device="cuda"), torch.randn(1000, 3, device="cuda")
    torch.testing.assert_close(ext.example_axpby(x, y, 2.0, -1.0), 2.0 * x - y)
    ext._set_output_poison(True)
    assert torch.isfinite(ext.example_axpby(x, y, 2.0, -1.0)).all()


def test_builtin_solution_is_judged_correct_and_timed():
    config = JudgeConfig(device="cuda")
    result = Judge(config).judge(load_task("builtin:gelu_bias_scale"),
                                 Candidate.from_ref("builtin:gelu_bias_scale", "cuda"))
    assert result.correct, result.reasons
    assert result.compile_ms is not None and result.runtime_ms is not None
    assert result.reward >= 1


def test_cuda_compile_error_has_line(tmp_path: Path):
    root = init_workspace(load_task("builtin:gelu_bias_scale"), tmp_path / "ws", "cuda")
    kernel = root / "kernels" / "example_axpby.cu"
    lines = kernel.read_text().splitlines()
    lines.append("__global__ void broken() { undefined_symbol_here = 1; }")
    kernel.write_text("\n".join(lines) + "\n")
    result = Builder(BuildConfig(device="cuda")).build(root)
    assert not result.ok
    assert (result.errors[0].file, result.errors[0].line) == ("kernels/example_axpby.cu",
                                                              len(lines))
