"""Honest kernels that must pass (invariant 8 of issue 30): arithmetic in another order than
PyTorch's, long fp32 reductions, more OpenMP threads than PyTorch's pool, an extension
function named as a PyTorch operator, in-place work on the kernel's own temporaries, outputs
over the output budget, several outputs, a view and a non-contiguous view of the kernel's own
memory, integer outputs. Each is judged end to end on the CPU (QUICK); the CUDA variants of
the key ones run on a GPU machine (``pytest -m gpu``) and are compiled here with nvcc."""

from __future__ import annotations

import textwrap
import uuid
from pathlib import Path

import pytest

from cuda_agent.judge import JudgeConfig
from tests.judge.adversarial import kernels
from tests.judge.adversarial.helpers import (
    MODEL_NEW_HEADER,
    judge,
    make_task,
    said,
    simple_model,
    write_workspace,
)

TASKS = {
    "rowsum": make_task("x", "torch.sum(x, dim=1)", "[torch.randn(64, 8192)]"),
    # 2^18 terms per row: one after another, fp32 rounding alone is about 9e-6 from float64
    "rowsum_long": make_task("x", "torch.sum(x, dim=1)", "[torch.randn(8, 262144)]"),
    "rowsum_keepdim": make_task("x", "torch.sum(x, dim=1, keepdim=True)",
                                "[torch.randn(64, 8192)]"),
    "sum_max": make_task("x", "(torch.sum(x, dim=1), torch.amax(x, dim=1))",
                         "[torch.randn(64, 4096)]"),
    "argmax": make_task("x", "torch.argmax(x, dim=1)", "[torch.randn(256, 1024)]"),
    "matmul": make_task("a, b", "torch.matmul(a, b)",
                        "[torch.randn(96, 512), torch.randn(512, 80)]"),
    "relu_affine": make_task("x", "torch.relu(x * 3.0 + 1.0)", "[torch.randn(100_003)]"),
}

IN_PLACE = MODEL_NEW_HEADER + '''

class ModelNew(nn.Module):
    def forward(self, x):
        y = cuda_extension.scale_shift(x, 3.0, 1.0)
        cuda_extension.relu_inplace(y)  # the kernel's own temporary, changed in place
        return y
'''


def honest(call: str, header: str = "", source: str = kernels.HONEST):
    return lambda d: write_workspace(d / "ws", simple_model(call, header),
                                     {"honest_binding.cpp": source})


CASES = {
    # other summation orders than PyTorch's
    "rowsum-blocked": ("rowsum", honest("cuda_extension.rowsum_blocked(inputs[0])",
                                        source=kernels.ROWSUM), {}),
    "rowsum-reversed": ("rowsum", honest("cuda_extension.rowsum_reversed(inputs[0])"), {}),
    "rowsum-pairwise": ("rowsum", honest("cuda_extension.rowsum_pairwise(inputs[0])"), {}),
    # 262144 terms per lane summed one after another: outside a fixed 5e-6 budget
    "rowsum-long-serial": ("rowsum_long", honest("cuda_extension.rowsum_serial(inputs[0])"),
                           {}),
    # 14 threads more than the cores (and than PyTorch's pool), parked between calls
    "openmp-team-over-the-pool": ("rowsum", honest("cuda_extension.rowsum_team(inputs[0])"),
                                  {}),
    # a GEMM whose binding is named as PyTorch's own operator, called on the module...
    "extension-function-named-mm": ("matmul", honest(
        "cuda_extension.mm(inputs[0], inputs[1])"), {}),
    # ... and through another name for the module (refused by name by the static check
    # until that check stops refusing by name)
    "extension-function-named-mm-as-ext": ("matmul", honest(
        "ext.mm(inputs[0], inputs[1])", "import cuda_extension as ext\n"), {}),
    "in-place-on-own-temporary": ("relu_affine", lambda d: write_workspace(
        d / "ws", IN_PLACE, {"honest_binding.cpp": kernels.HONEST}), {}),
    # fewer calls checked, and the verdict says why
    "over-the-output-budget": ("rowsum", honest("cuda_extension.rowsum_serial(inputs[0])"),
                               {"output_budget_gb": 1e-6}),
    "several-outputs": ("sum_max", honest("cuda_extension.sum_max(inputs[0])"), {}),
    "view-of-own-output": ("rowsum_keepdim", honest(
        "cuda_extension.rowsum_pairwise(inputs[0]).view(-1, 1)"), {}),
    "integer-output": ("argmax", honest("cuda_extension.argmax_rows(inputs[0])"), {}),
    "non-contiguous-output": ("matmul", honest(
        "cuda_extension.mm_transposed(inputs[0], inputs[1]).t()"), {}),
}


def _write_task(folder: Path, name: str, tasks: dict[str, str] = TASKS) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.py"
    path.write_text(tasks[name])
    return path


@pytest.mark.parametrize("name", list(CASES))
def test_honest_kernel_passes(tmp_path: Path, name: str):
    task_name, write, update = CASES[name]
    result = judge(_write_task(tmp_path, task_name), write(tmp_path / "candidate"), **update)
    assert result.correct and result.reward >= 1, f"reward {result.reward}: {said(result)}"
    if "output_budget_gb" in update:
        assert "output budget" in said(result), said(result)


# --- CUDA ------------------------------------------------------------------------------------

GPU = JudgeConfig(device="cuda", time_compile=False, time_budget_s=1.0, process_timeout_s=300)

GPU_TASKS = {
    "gemm": make_task("a, b", "torch.matmul(a, b)",
                      "[torch.randn(2048, 2048), torch.randn(2048, 2048)]"),
    "rowsum_long": make_task("x", "torch.sum(x, dim=1)", "[torch.randn(64, 131072)]"),
    "rowsum": make_task("x", "torch.sum(x, dim=1)", "[torch.randn(4096, 8192)]"),
}

CUDA_BINDING = r'''
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "binding_registry.h"

extern "C" void rowsum_launch(const float* x, float* out, int64_t rows, int64_t cols,
                              int blocked, cudaStream_t stream);

namespace {
using cuda_ext::Args;
using cuda_ext::DType;
using cuda_ext::Outputs;
using cuda_ext::Tensor;

void check_f32(const Tensor& t, const char* what) {
  CUDA_EXT_CHECK(t.is_cuda() && t.dtype == DType::Float32 && t.is_contiguous(), what);
}

cudaStream_t stream_of(const Tensor& t) {
  return static_cast<cudaStream_t>(cuda_ext::current_stream(t));
}

cublasHandle_t handle() {
  static cublasHandle_t created = nullptr;
  if (!created && cublasCreate(&created) != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error("cublasCreate failed");
  return created;
}

// mm(a, b) -> a @ b by cublasSgemm in fp32, named as PyTorch names its own operator;
// row-major C = A @ B is column-major C^T = B^T A^T
Outputs mm(const Args& args) {
  const Tensor& a = args.tensor(0);
  const Tensor& b = args.tensor(1);
  check_f32(a, "a");
  check_f32(b, "b");
  CUDA_EXT_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(0) &&
                 a.device == b.device, "a: (m, k), b: (k, n), one device");
  const int m = static_cast<int>(a.size(0)), k = static_cast<int>(a.size(1));
  const int n = static_cast<int>(b.size(1));
  Tensor c = cuda_ext::empty({a.size(0), b.size(1)}, DType::Float32, a.device);
  cublasHandle_t h = handle();
  const float one = 1.0f, zero = 0.0f;
  if (cublasSetStream(h, stream_of(c)) != CUBLAS_STATUS_SUCCESS ||
      cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &one, b.data_ptr<float>(), n,
                  a.data_ptr<float>(), k, &zero, c.data_ptr<float>(), n) !=
          CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error("cublasSgemm failed");
  return {c};
}

Outputs rowsum(const Args& args, int blocked) {
  const Tensor& x = args.tensor(0);
  check_f32(x, "x");
  CUDA_EXT_CHECK(x.dim() == 2, "x must be 2-d");
  Tensor out = cuda_ext::empty({x.size(0)}, DType::Float32, x.device);
  rowsum_launch(x.data_ptr<float>(), out.data_ptr<float>(), x.size(0), x.size(1), blocked,
                stream_of(x));
  return {out};
}

Outputs rowsum_serial(const Args& args) { return rowsum(args, 0); }
Outputs rowsum_blocked(const Args& args) { return rowsum(args, 1); }
}  // namespace

REGISTER_BINDING(mm, "mm(a, b) -> a @ b (cuBLAS, fp32)", mm);
REGISTER_BINDING(rowsum_serial, "rowsum_serial(x) -> x.sum(1), a thread per row",
                 rowsum_serial);
REGISTER_BINDING(rowsum_blocked, "rowsum_blocked(x) -> x.sum(1), a block per row",
                 rowsum_blocked);
'''

ROWSUM_CU = r'''
#include <cuda_runtime.h>

#include <cstdint>

// one thread per row, one term after another: a long fp32 reduction
__global__ void rowsum_serial(const float* x, float* out, int64_t rows, int64_t cols) {
  const int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (r >= rows) return;
  const float* row = x + r * cols;
  float total = 0.0f;
  for (int64_t c = 0; c < cols; ++c) total += row[c];
  out[r] = total;
}

// one block per row: strided partial sums, then a tree in shared memory
__global__ void rowsum_blocked(const float* x, float* out, int64_t cols) {
  __shared__ float part[256];
  const float* row = x + blockIdx.x * cols;
  float total = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) total += row[c];
  part[threadIdx.x] = total;
  __syncthreads();
  for (int step = blockDim.x / 2; step > 0; step >>= 1) {
    if (threadIdx.x < step) part[threadIdx.x] += part[threadIdx.x + step];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = part[0];
}

extern "C" void rowsum_launch(const float* x, float* out, int64_t rows, int64_t cols,
                              int blocked, cudaStream_t stream) {
  if (rows <= 0) return;
  if (blocked)
    rowsum_blocked<<<static_cast<unsigned>(rows), 256, 0, stream>>>(x, out, cols);
  else
    rowsum_serial<<<static_cast<unsigned>((rows + 127) / 128), 128, 0, stream>>>(
        x, out, rows, cols);
}
'''

CUDA_SOURCES = {"honest_cuda_binding.cpp": CUDA_BINDING, "rowsum.cu": ROWSUM_CU}

GPU_CASES = {
    "cublas-sgemm-named-mm": ("gemm", "cuda_extension.mm(inputs[0], inputs[1])"),
    "long-serial-rowsum": ("rowsum_long", "cuda_extension.rowsum_serial(inputs[0])"),
    "blocked-rowsum": ("rowsum", "cuda_extension.rowsum_blocked(inputs[0])"),
}


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(GPU_CASES))
def test_honest_cuda_kernel_passes(tmp_path: Path, name: str):
    task_name, call = GPU_CASES[name]
    candidate = write_workspace(tmp_path / "candidate", simple_model(call), CUDA_SOURCES)
    result = judge(_write_task(tmp_path, task_name, GPU_TASKS), candidate, GPU)
    assert result.correct and result.reward >= 1, f"reward {result.reward}: {said(result)}"


def _compile(tmp_path: Path, names: list[str]):
    """The toolchain for CUDA and each of ``names`` (of CUDA_SOURCES) compiled afresh (a new
    comment on top: never from the cache), for the CUDA target; nothing runs."""
    from cuda_agent.build import toolchain
    from cuda_agent.build.builder import BuildConfig, Builder

    builder = Builder(BuildConfig(device="cuda", arch="90a"))
    chain = builder._chain = toolchain.detect("cuda", builder.cache, arch="90a")
    (tmp_path / "kernels").mkdir(exist_ok=True)
    units = []
    for name in names:
        text = textwrap.dedent(CUDA_SOURCES[name])
        (tmp_path / "kernels" / name).write_text(f"// {uuid.uuid4()}\n{text}")
        unit = builder._object(Path("kernels") / name, chain, builder.kernel_files(tmp_path))
        assert unit[1] == "compiled", unit[3][-3000:]
        units.append(unit)
    return builder, chain, units


@pytest.mark.nvcc
def test_honest_cuda_kernels_compile(tmp_path: Path):
    """Compile-only: the reductions build with nvcc for the CUDA target."""
    from cuda_agent.build.builder import _refused_calls

    builder, chain, units = _compile(tmp_path, ["rowsum.cu"])
    assert not _refused_calls(chain, units, builder.cache)


@pytest.mark.nvcc
def test_honest_cuda_binding_compiles_and_calls_only_what_is_allowed(tmp_path: Path):
    """Compile-only: the binding (cuBLAS behind ``mm``) builds for the CUDA target, and with
    the kernels calls nothing the symbol check refuses (cuBLAS is allowed on CUDA). Needs
    cuBLAS's headers where the toolchain looks (a CUDA toolkit with cuBLAS)."""
    from cuda_agent.build import toolchain
    from cuda_agent.build.builder import Builder, _refused_calls

    chain = toolchain.detect("cuda", Builder().cache, arch="90a")
    if not chain.cuda_home or not (Path(chain.cuda_home) / "include" / "cublas_v2.h").is_file():
        pytest.skip(f"no cublas_v2.h under {chain.cuda_home}/include")
    builder, chain, units = _compile(tmp_path, list(CUDA_SOURCES))
    assert not _refused_calls(chain, units, builder.cache)
