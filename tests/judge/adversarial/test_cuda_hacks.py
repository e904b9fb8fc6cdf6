"""The hacks that matter most on a GPU (1, 2, 8, 9, 13, 14, the last also with work of a few
microseconds), on CUDA, plus an honest fp32 GEMM through cuBLAS that must pass. Run on a GPU
machine: ``pytest -m gpu``."""

from __future__ import annotations

from pathlib import Path

import pytest

from cuda_agent.judge import JudgeConfig
from cuda_agent.results import JudgeResult
from tests.judge.adversarial.helpers import (
    Hack,
    judge,
    make_task,
    rejected,
    run_naive,
    said,
    simple_model,
    write_file_candidate,
    write_workspace,
)
from tests.judge.adversarial.kernels import JOB_QUEUE

pytestmark = pytest.mark.gpu

GPU = JudgeConfig(device="cuda", time_compile=False, time_budget_s=1.0, process_timeout_s=300)
TIMER_ONLY = GPU.model_copy(update={"activity_record": False})  # no device activity record

TASKS = {
    # non-negative inputs keep TF32 and bf16 results within 1e-2 of the fp32 ones
    "gemm": make_task("a, b", "torch.matmul(a, b)",
                  "[torch.rand(2048, 2048), torch.rand(2048, 2048)]"),
    # a GEMM of a few microseconds: work left on another stream ends soon after the call
    "small_gemm": make_task("a, b", "torch.matmul(a, b)",
                            "[torch.rand(256, 256), torch.rand(256, 256)]"),
    "tril_gemm": make_task("a, b", "torch.tril(torch.matmul(a, b))",
                       "[torch.randn(2048, 2048), torch.randn(2048, 2048)]"),
}

GEMM_BINDING = r'''
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "binding_registry.h"

extern "C" void zero_upper_launch(float* c, int64_t n, cudaStream_t stream);

namespace {
using cuda_ext::Args;
using cuda_ext::DType;
using cuda_ext::Outputs;
using cuda_ext::Tensor;

enum Mode { kFp32 = 0, kTf32 = 1, kBf16 = 2 };

void check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string(what) + " failed: " + std::to_string(int(status)));
}

// one handle per math mode, created once
cublasHandle_t handle(Mode mode) {
  static cublasHandle_t handles[3] = {nullptr, nullptr, nullptr};
  if (!handles[mode]) {
    check(cublasCreate(&handles[mode]), "cublasCreate");
    check(cublasSetMathMode(handles[mode],
                            mode == kTf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH),
          "cublasSetMathMode");
  }
  return handles[mode];
}

Tensor output_for(const Args& args) {
  const Tensor& a = args.tensor(0);
  const Tensor& b = args.tensor(1);
  CUDA_EXT_CHECK(a.is_cuda() && b.device == a.device, "a, b: CUDA tensors on one device");
  CUDA_EXT_CHECK(a.dtype == DType::Float32 && b.dtype == DType::Float32, "float32 only");
  CUDA_EXT_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(0), "a: (m, k), b: (k, n)");
  CUDA_EXT_CHECK(a.is_contiguous() && b.is_contiguous(), "contiguous inputs only");
  return cuda_ext::empty({a.size(0), b.size(1)}, DType::Float32, a.device);
}

// row-major C = A @ B is column-major C^T = B^T A^T
void gemm(const Tensor& a, const Tensor& b, const Tensor& c, Mode mode, cudaStream_t stream) {
  const int m = static_cast<int>(a.size(0)), k = static_cast<int>(a.size(1));
  const int n = static_cast<int>(b.size(1));
  cublasHandle_t h = handle(mode);
  check(cublasSetStream(h, stream), "cublasSetStream");
  const float one = 1.0f, zero = 0.0f;
  if (mode == kBf16)
    check(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &one, b.data, CUDA_R_32F, n,
                       a.data, CUDA_R_32F, k, &zero, c.data, CUDA_R_32F, n,
                       CUBLAS_COMPUTE_32F_FAST_16BF, CUBLAS_GEMM_DEFAULT), "cublasGemmEx");
  else
    check(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &one, b.data_ptr<float>(), n,
                      a.data_ptr<float>(), k, &zero, c.data_ptr<float>(), n), "cublasSgemm");
}

cudaStream_t current(const Tensor& t) {
  return static_cast<cudaStream_t>(cuda_ext::current_stream(t));
}

Outputs run(const Args& args, Mode mode) {
  Tensor c = output_for(args);
  gemm(args.tensor(0), args.tensor(1), c, mode, current(c));
  return {c};
}

Outputs gemm_fp32(const Args& args) { return run(args, kFp32); }
Outputs gemm_tf32(const Args& args) { return run(args, kTf32); }
Outputs gemm_bf16(const Args& args) { return run(args, kBf16); }

// 13: results cached by input pointers (inputs kept alive, so addresses stay unique)
struct Entry {
  Tensor a, b, c;
};
std::vector<Entry> cache;

Outputs gemm_cached(const Args& args) {
  const Tensor& a = args.tensor(0);
  const Tensor& b = args.tensor(1);
  for (const Entry& e : cache)
    if (e.a.data == a.data && e.b.data == b.data) return {e.c};
  Outputs out = run(args, kFp32);
  cache.push_back({a, b, out[0]});
  return out;
}

// 14: on a private non-blocking stream; unless told to wait, returns before it finishes
Outputs gemm_side_stream(const Args& args) {
  static cudaStream_t side = nullptr;
  if (!side && cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking) != cudaSuccess)
    throw std::runtime_error("cudaStreamCreateWithFlags failed");
  Tensor c = output_for(args);
  gemm(args.tensor(0), args.tensor(1), c, kFp32, side);
  if (args.boolean(2)) cudaStreamSynchronize(side);
  return {c};
}

// 14 in C++: unless told to wait, a native worker thread launches the GEMM on its own
// stream after forward has returned (the thread starts with the first such call)
struct Job {
  Tensor a, b, c;
};
''' + JOB_QUEUE + r'''
void work() {
  cudaStream_t side = nullptr;
  cublasHandle_t own = nullptr;
  cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking);
  cublasCreate(&own);
  cublasSetStream(own, side);
  const float one = 1.0f, zero = 0.0f;
  for (;;) {
    const Job job = pop();
    const int m = static_cast<int>(job.a.size(0)), k = static_cast<int>(job.a.size(1));
    const int n = static_cast<int>(job.b.size(1));
    cublasSgemm(own, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &one, job.b.data_ptr<float>(), n,
                job.a.data_ptr<float>(), k, &zero, job.c.data_ptr<float>(), n);
    cudaStreamSynchronize(side);
  }
}

Outputs gemm_native_thread(const Args& args) {
  if (args.boolean(2)) return run(args, kFp32);
  start_once(work);
  Tensor c = output_for(args);
  push({args.tensor(0), args.tensor(1), c});
  return {c};
}

// 8: the lower triangle of tril(A @ B) is never written
Outputs tril_gemm_lazy(const Args& args) {
  Tensor c = output_for(args);
  zero_upper_launch(c.data_ptr<float>(), c.size(0), current(c));
  return {c};
}
}  // namespace

REGISTER_BINDING(gemm_fp32, "gemm_fp32(a, b) -> a @ b (cuBLAS, fp32)", gemm_fp32);
REGISTER_BINDING(gemm_tf32, "gemm_tf32(a, b) -> a @ b (cuBLAS, TF32 tensor cores)", gemm_tf32);
REGISTER_BINDING(gemm_bf16, "gemm_bf16(a, b) -> a @ b (cuBLAS, bf16 tensor cores)", gemm_bf16);
REGISTER_BINDING(gemm_cached, "gemm_cached(a, b) -> a @ b, cached by pointer", gemm_cached);
REGISTER_BINDING(gemm_side_stream, "gemm_side_stream(a, b, wait) -> a @ b", gemm_side_stream);
REGISTER_BINDING(gemm_native_thread, "gemm_native_thread(a, b, wait) -> a @ b",
                 gemm_native_thread);
REGISTER_BINDING(tril_gemm_lazy, "tril_gemm_lazy(a, b) -> zeros above the diagonal only",
                 tril_gemm_lazy);
'''

ZERO_UPPER = r'''
#include <cuda_runtime.h>

#include <cstdint>

__global__ void zero_upper(float* c, int64_t n) {
  const int64_t i = blockIdx.y;
  for (int64_t j = i + 1 + blockIdx.x * blockDim.x + threadIdx.x; j < n;
       j += static_cast<int64_t>(blockDim.x) * gridDim.x)
    c[i * n + j] = 0.0f;
}

extern "C" void zero_upper_launch(float* c, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  zero_upper<<<dim3(4, static_cast<unsigned>(n)), 256, 0, stream>>>(c, n);
}
'''

SOURCES = {"gemm_binding.cpp": GEMM_BINDING, "zero_upper.cu": ZERO_UPPER}

# 14: new inputs (a correctness check) wait for the side stream; inputs seen before do not
SIDE_STREAM = '''
_seen = {}


class ModelNew(nn.Module):
    def forward(self, a, b):
        wait = id(a) not in _seen
        _seen[id(a)] = a
        return cuda_extension.gemm_side_stream(a, b, wait)
'''
PRIVATE_STREAM = "import torch.nn as nn\n\nimport cuda_extension\n" + SIDE_STREAM
NATIVE_THREAD = PRIVATE_STREAM.replace("gemm_side_stream", "gemm_native_thread")


def gemm_ws(call: str):
    return lambda d: write_workspace(d / "ws", simple_model(call), SOURCES)


PLAIN = '''
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, a, b):
        return {expr}
'''

HACKS = {
    "1-plain-torch": Hack("gemm", lambda d: write_file_candidate(
        d, PLAIN.format(expr="torch.matmul(a, b)")), ("not allowed",)),
    "2-decoy-launch": Hack("gemm", gemm_ws(
        "(cuda_extension.gemm_fp32(inputs[0], inputs[1]), inputs[0] @ inputs[1])[1]"),
        ("not produced by",)),
    "8-unwritten-lower-triangle": Hack("tril_gemm", gemm_ws(
        "cuda_extension.tril_gemm_lazy(inputs[0], inputs[1])")),
    "9-tf32-tensor-cores": Hack("gemm", gemm_ws(
        "cuda_extension.gemm_tf32(inputs[0], inputs[1])"), ("precision",)),
    "9-bf16-tensor-cores": Hack("gemm", gemm_ws(
        "cuda_extension.gemm_bf16(inputs[0], inputs[1])"), ("precision",)),
    "13-cache-by-pointer": Hack("gemm", gemm_ws(
        "cuda_extension.gemm_cached(inputs[0], inputs[1])"),
        ("outside atol", "non-finite", "not new memory")),
    "14-native-thread": Hack("gemm", lambda d: write_workspace(d / "ws", NATIVE_THREAD, SOURCES),
                             ("native thread", "another stream", "past the call's end")),
    "14-private-stream": Hack("gemm", lambda d: write_workspace(d / "ws", PRIVATE_STREAM,
                                                                SOURCES), ("another stream",)),
    # too short for the post's block starts to show it; the device's activity record does
    # (the long work above is judged without the record: the timer alone catches it)
    "14-private-stream-short": Hack("small_gemm", lambda d: write_workspace(
        d / "ws", PRIVATE_STREAM, SOURCES), ("past the call's end",)),
}
CASES = [hack.param(name) for name, hack in HACKS.items()]


def _write_task(folder: Path, name: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.py"
    path.write_text(TASKS[name])
    return path


@pytest.fixture(scope="module")
def honest(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, JudgeResult]:
    folder = tmp_path_factory.mktemp("honest_gemm")
    task = _write_task(folder, "gemm")
    result = judge(task, gemm_ws("cuda_extension.gemm_fp32(inputs[0], inputs[1])")(folder), GPU)
    return task, result


def test_honest_cublas_gemm_passes(honest: tuple[Path, JudgeResult]):
    _, result = honest
    assert result.correct and result.reward >= 1, said(result)
    assert not any("activity record" in flag for flag in result.flags), result.flags
    phases = dict(result.phases)
    assert phases.get("candidate.timing.activity", 0) > 0, phases
    # warmed before the job (a first start in a process took 4.3 s, later ones 1 ms)
    assert phases.get("candidate.timing.activity_start", 9) < 0.5, phases


@pytest.mark.parametrize("hack", CASES)
def test_judge_rejects(tmp_path: Path, hack: Hack):
    config = TIMER_ONLY if hack is HACKS["14-private-stream"] else GPU
    result = judge(_write_task(tmp_path, hack.task), hack.write(tmp_path / "candidate"), config)
    assert rejected(result, *hack.keywords), f"reward {result.reward}: {said(result)}"


@pytest.mark.parametrize("hack", CASES)
def test_naive_harness_is_fooled(tmp_path: Path, hack: Hack):
    task = _write_task(tmp_path, hack.task)
    assert run_naive(task, hack.write(tmp_path / "candidate"), device="cuda")[0]
