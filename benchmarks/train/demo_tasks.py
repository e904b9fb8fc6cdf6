"""The learning demonstration's task family and its scripted expert.

    tasks = chain_tasks(count=48, seed=0)           # [(name, ops)], distinct op chains
    write_task(folder, name, ops)                    # folder/NAME.py, a reference Model
    write_expert_replay(path, ops, device)           # one reply: kernel, binding, model_new

Each task is a fused elementwise chain, ``x -> op_k(... op_1(x))`` on a (batch, features)
float32 tensor, from ``OPS``; the expert writes one kernel that applies the chain in one
pass (CUDA, or C++ with OpenMP on the CPU) in a single reply and submits. What varies
between tasks is only the chain, so a model that learned the template and to read the
chain off the reference code solves a held-out chain.
"""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

OPS: dict[str, tuple[str, str]] = {  # name: (torch expression of x, kernel statement on v)
    "relu": ("torch.relu(x)", "v = v > 0.0f ? v : 0.0f;"),
    "tanh": ("torch.tanh(x)", "v = tanhf(v);"),
    "sigmoid": ("torch.sigmoid(x)", "v = 1.0f / (1.0f + expf(-v));"),
    "abs": ("torch.abs(x)", "v = fabsf(v);"),
    "double": ("x * 2.0", "v = v * 2.0f;"),
    "shift": ("x + 1.0", "v = v + 1.0f;"),
    "square": ("x * x", "v = v * v;"),
    "neg": ("-x", "v = -v;"),
}

TASK = '''import torch
import torch.nn as nn


class Model(nn.Module):
    """Elementwise chain: {names}."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
{lines}
        return x


batch = {batch}
features = 1024


def get_inputs():
    return [torch.randn(batch, features)]


def get_init_inputs():
    return []
'''

CUDA_KERNEL = '''#include <cuda_runtime.h>
#include <cstdint>

__global__ void chain_kernel(const float* __restrict__ x, float* __restrict__ out, int64_t n) {{
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t start = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t i = start; i < n; i += stride) {{
    float v = x[i];
{ops}
    out[i] = v;
  }}
}}

extern "C" void chain_launch(const float* x, float* out, int64_t n, cudaStream_t stream) {{
  if (n <= 0) return;
  int64_t blocks = (n + 255) / 256;
  if (blocks > 4096) blocks = 4096;
  chain_kernel<<<static_cast<int>(blocks), 256, 0, stream>>>(x, out, n);
}}
'''

CPU_KERNEL = '''#include <cmath>
#include <cstdint>

extern "C" void chain_launch(const float* __restrict__ x, float* __restrict__ out, int64_t n) {{
#pragma omp parallel for schedule(static) if (n >= (int64_t{{1}} << 14))
  for (int64_t i = 0; i < n; ++i) {{
    float v = x[i];
{ops}
    out[i] = v;
  }}
}}
'''

BINDING = '''#include <cstdint>
{includes}
#include "binding_registry.h"

extern "C" void chain_launch(const float* x, float* out, int64_t n{stream_arg});

namespace {{

cuda_ext::Outputs chain(const cuda_ext::Args& args) {{
  const cuda_ext::Tensor& x = args.tensor(0);
  CUDA_EXT_CHECK({device_check}, "x is on the wrong device");
  CUDA_EXT_CHECK(x.dtype == cuda_ext::DType::Float32, "x must be float32");
  CUDA_EXT_CHECK(x.is_contiguous(), "x must be contiguous");
  cuda_ext::Tensor out = cuda_ext::empty_like(x);
  chain_launch(x.data_ptr<float>(), out.data_ptr<float>(), x.numel(){stream});
  return {{out}};
}}

}}  // namespace

REGISTER_BINDING(chain, "chain(x: Tensor) -> Tensor", chain);
'''

MODEL_NEW = '''import cuda_extension
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cuda_extension.chain(x.contiguous())
'''


def chain_tasks(count: int, seed: int = 0, lengths: tuple[int, ...] = (2, 3)
                ) -> list[tuple[str, tuple[str, ...]]]:
    """``count`` distinct chains (no op twice in a row), shuffled by ``seed``."""
    chains = [c for n in lengths for c in itertools.product(OPS, repeat=n)
              if all(a != b for a, b in itertools.pairwise(c))]
    random.Random(seed).shuffle(chains)
    if count > len(chains):
        raise ValueError(f"only {len(chains)} distinct chains of lengths {lengths}")
    return [("chain_" + "_".join(c), c) for c in chains[:count]]


def write_task(folder: Path, name: str, ops: tuple[str, ...], batch: int = 256) -> Path:
    lines = "\n".join(f"        x = {OPS[op][0]}" for op in ops)
    path = folder / f"{name}.py"
    path.write_text(TASK.format(names=", ".join(ops), lines=lines, batch=batch))
    return path


def expert_files(ops: tuple[str, ...], device: str) -> dict[str, str]:
    """The expert's solution: workspace path -> content."""
    body = "\n".join(f"    {OPS[op][1]}" for op in ops)
    if device == "cuda":
        kernel = ("kernels/chain.cu", CUDA_KERNEL.format(ops=body))
        binding = BINDING.format(includes="#include <cuda_runtime.h>\n",
                                 stream_arg=", cudaStream_t stream", device_check="x.is_cuda()",
                                 stream=", static_cast<cudaStream_t>("
                                 "cuda_ext::current_stream(x))")
    else:
        kernel = ("kernels/chain.cpp", CPU_KERNEL.format(ops=body))
        binding = BINDING.format(includes="", stream_arg="", device_check="!x.is_cuda()",
                                 stream="")
    return {kernel[0]: kernel[1], "kernels/chain_binding.cpp": binding,
            "model_new.py": MODEL_NEW}


def write_expert_replay(path: Path, ops: tuple[str, ...], device: str) -> Path:
    """A replay policy file: one reply that writes the solution and submits."""
    calls = [{"id": f"c{i}", "name": "write_file", "arguments": {"path": p, "content": c}}
             for i, (p, c) in enumerate(expert_files(ops, device).items())]
    calls.append({"id": "s", "name": "submit", "arguments": {"message": "fused chain"}})
    path.write_text(json.dumps([{"role": "assistant", "content": "One fused kernel.",
                                 "tool_calls": calls}]))
    return path
