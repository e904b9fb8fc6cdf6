"""torch.matmul(A, B) for a 3-D A and a matrix B, as one register-tiled fp32 GEMM kernel."""

import cuda_extension
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """(N, M, K) @ (K, L) -> (N, M, L) in true fp32 (no TF32)."""

    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return cuda_extension.tensor_matmul(A.contiguous(), B.contiguous())
