"""ReLU as one streaming CUDA kernel (KernelBench level 1, problem 19)."""

import cuda_extension
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """max(x, 0) element-wise, read once and written once."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cuda_extension.relu(x.contiguous())
