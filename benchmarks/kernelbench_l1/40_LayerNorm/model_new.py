"""LayerNorm over the trailing normalized_shape with custom CUDA kernels.

Rows of up to 8192 elements are normalised in one pass from registers; longer rows (the
benchmark's are 4M elements) are split into chunks whose statistics are merged exactly.
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
