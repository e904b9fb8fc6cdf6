"""LayerNorm over the trailing normalized_shape with OpenMP C++ kernels.

CPU twin of the CUDA candidate in benchmarks/kernelbench_l1/40_LayerNorm: rows are split
into 8192-element chunks whose statistics are merged exactly, so few long rows still use
every core.
"""

import cuda_extension
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """Same parameters as the reference (``ln.weight``, ``ln.bias``)."""

    def __init__(self, normalized_shape: tuple):
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape=normalized_shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cuda_extension.layer_norm(
            x.contiguous(), self.ln.weight.contiguous(), self.ln.bias.contiguous(),
            float(self.ln.eps),
        )
