"""A candidate whose CUDA kernel writes far out of bounds (an illegal memory access), judged
through the pool on GPU 0 and followed by an honest job: the bad job ends with a reason that
names the failure, the honest one is judged correct by the same pool, and the pool still has
one live worker on the GPU. Run on a GPU machine: ``pytest -m gpu``. The kernel's compile
check needs only nvcc (``-m nvcc``)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from cuda_agent.execution import JobFailed, JudgePool, PoolConfig
from cuda_agent.judge import JudgeConfig
from cuda_agent.results import JudgeResult
from cuda_agent.tasks import load_task
from cuda_agent.tasks.loaders import builtin_dir
from tests.conftest import compile_cuda_units
from tests.execution.helpers import alive

GELU = "builtin:gelu_bias_scale"
SOLUTION = builtin_dir() / "gelu_bias_scale" / "solution" / "cuda"
KERNEL = "kernels/gelu_bias_scale.cu"

# Same launcher as the shipped solution (its binding is kept), but every thread stores 4 TiB
# past the end of ``out``: far outside any allocation, so the first store faults.
OOB_KERNEL = r'''
#include <cuda_runtime.h>

#include <cstdint>

__global__ void write_far_out_of_bounds(float* out, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i + (static_cast<int64_t>(1) << 40)] = 1.0f;
}

extern "C" void gelu_bias_scale_launch(const float* x, const float* bias, float* out,
                                       int64_t rows, int64_t cols, float scale, int config,
                                       cudaStream_t stream) {
  (void)x;
  (void)bias;
  (void)scale;
  (void)config;
  const int64_t n = rows * cols;
  if (n <= 0) return;
  const int threads = 256;
  const int blocks = static_cast<int>((n + threads - 1) / threads < 65535
                                      ? (n + threads - 1) / threads : 65535);
  write_far_out_of_bounds<<<blocks, threads, 0, stream>>>(out, n);
}
'''

# what a reason naming the fault may say (torch, the CUDA runtime, or the judge's summary)
FAULT = re.compile(r"illegal memory access|illegal address|cudaErrorIllegalAddress|"
                   r"unspecified launch failure|CUDA error", re.IGNORECASE)


def oob_workspace(folder: Path) -> Path:
    """The shipped CUDA solution with its kernel replaced by the out-of-bounds writer."""
    shutil.copytree(SOLUTION, folder)
    (folder / KERNEL).write_text(OOB_KERNEL)
    return folder


def reason_of(result: JudgeResult | JobFailed) -> str:
    if isinstance(result, JobFailed):
        return result.reason
    return " | ".join([*result.reasons, *result.flags])


@pytest.mark.gpu
def test_out_of_bounds_kernel_fails_with_reason_and_pool_keeps_serving(tmp_path: Path):
    task = load_task(GELU)
    bad = oob_workspace(tmp_path / "oob")
    config = PoolConfig(gpus=[0], retries=1, job_timeout_s=300,
                        judge=JudgeConfig(device="cuda", time=False, trials=2))
    with JudgePool(config) as pool:
        # one worker: the honest job runs after the faulting one, on the same GPU
        faulty = pool.submit(task, bad)
        honest = pool.submit(task, GELU)
        first = faulty.result(timeout=600)
        second = honest.result(timeout=600)
        stats = pool.stats()
        pids = pool.worker_pids()
        assert len(pids) == 1 and alive(pids[0]), "the pool must still have its GPU worker"
    text = reason_of(first)
    if isinstance(first, JudgeResult):  # the fault stayed in the candidate's own process
        assert not first.correct and first.reward == -1, first
    else:  # the worker's own context failed: replaced, and the job failed with the reason
        assert stats.replaced >= 1, stats
    assert FAULT.search(text), f"the reason does not name the fault: {text[:2000]}"
    assert isinstance(second, JudgeResult) and second.correct, reason_of(second)[:2000]
    assert (stats.queued, stats.running, stats.workers) == (0, 0, 1), stats
    assert stats.done + stats.failed == 2, stats


@pytest.mark.nvcc
def test_out_of_bounds_kernel_compiles(tmp_path: Path):
    """Compile-only check of the faulting kernel with the project's builder (no GPU needed)."""
    units = compile_cuda_units(oob_workspace(tmp_path / "oob"))
    assert [u[0] for u in units] == [KERNEL, "kernels/gelu_bias_scale_binding.cpp"]
    for source, status, obj, log in units:
        assert status in ("compiled", "cached") and obj.exists(), f"{source}:\n{log}"
