"""KernelBench 1/12 (diag(A) @ B) as a single-file candidate: one load_inline CUDA module."""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CUDA = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

__global__ void diag_rows(const float* a, const float* b, float* c, long rows, long cols) {
  const long n = rows * cols;
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n;
       i += (long)gridDim.x * blockDim.x) {
    c[i] = a[i / cols] * b[i];
  }
}

torch::Tensor diag_matmul(torch::Tensor a, torch::Tensor b) {
  auto c = torch::empty_like(b);
  diag_rows<<<1056, 256, 0, at::cuda::getCurrentCUDAStream()>>>(
      a.data_ptr<float>(), b.data_ptr<float>(), c.data_ptr<float>(), b.size(0), b.size(1));
  return c;
}
"""

ext = load_inline("diag_inline", cpp_sources="torch::Tensor diag_matmul(torch::Tensor a, "
                  "torch::Tensor b);", cuda_sources=CUDA, functions=["diag_matmul"])


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return ext.diag_matmul(A.contiguous(), B.contiguous())
