"""diag(A) @ B as one streaming CUDA kernel: C[i, j] = A[i] * B[i, j]."""

import cuda_extension
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """Scales each row of B by the matching entry of the diagonal A."""

    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return cuda_extension.diag_matmul(A.contiguous(), B.contiguous())
