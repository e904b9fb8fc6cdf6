"""The CUDA path end to end; run on a GPU machine with ``pytest -m gpu``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cuda_agent.build import BuildConfig, Builder
from cuda_agent.judge import Candidate, Judge, JudgeConfig
from cuda_agent.tasks import load_task
from cuda_agent.workspace import init_workspace

pytestmark = pytest.mark.gpu


RUN_EXAMPLE = """
import sys, torch
from cuda_agent.build import load_extension
ext = load_extension(sys.argv[1])
x, y = torch.randn(1000, 3, device="cuda"), torch.randn(1000, 3, device="cuda")
torch.testing.assert_close(ext.example_axpby(x, y, 2.0, -1.0), 2.0 * x - y)
ext._set_output_poison(True)
assert torch.isfinite(ext.example_axpby(x, y, 2.0, -1.0)).all()
print("ok")
"""


def test_example_kernel_builds_and_runs(tmp_path: Path):
    root = init_workspace(load_task("builtin:gelu_bias_scale"), tmp_path / "ws", "cuda")
    result = Builder(BuildConfig(device="cuda")).build(root)
    assert result.ok, result.log
    # a fresh process: other tests of this session may have loaded another cuda_extension
    done = subprocess.run([sys.executable, "-c", RUN_EXAMPLE, str(result.extension_path)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_builtin_solution_is_judged_correct_and_timed():
    config = JudgeConfig(device="cuda")
    result = Judge(config).judge(load_task("builtin:gelu_bias_scale"),
                                 Candidate.from_ref("builtin:gelu_bias_scale", "cuda"))
    assert result.correct, result.reasons
    assert result.compile_ms is not None and result.runtime_ms is not None
    assert result.reward >= 1


def test_runtime_pooled_over_candidate_processes_and_baselines_over_five():
    """On CUDA the baselines are timed in 5 processes by default; with candidate_processes=2
    the candidate is timed in two confined processes, each with its own lent device pack."""
    config = JudgeConfig(device="cuda", time_compile=False, candidate_processes=2,
                         cache_baselines=False)
    result = Judge(config).judge(load_task("builtin:gelu_bias_scale"),
                                 Candidate.from_ref("builtin:gelu_bias_scale", "cuda"))
    assert result.correct, result.reasons
    assert result.timing.processes == 2 and result.eager_timing.processes == 5
    assert result.time_meaning.startswith("device-wide GPU time")
    phases = dict(result.phases)
    assert phases["candidate2.timing"] > 0.0 and "candidate2.forward" not in phases


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
