import cuda_extension
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """Bias + exact GELU + scale fused into one pass by the gelu_bias_scale kernel."""

    def __init__(self, features: int, scale: float):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(features))
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cuda_extension.gelu_bias_scale(x.contiguous(), self.bias, self.scale)
