"""Calibration task for the judge-v2 GPU benchmark: y = tanh(x) * 0.5 + x.

Eager PyTorch runs three element-wise kernels (tanh, multiply, add) over 8 M float32 values
(32 MiB per tensor), about 50-100 us on an H100 or H200. The candidate in ``candidate/``
computes the same function in one kernel with a tunable delay, so a benchmark can give it
a known speed-up over eager.
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    """Element-wise y = tanh(x) * 0.5 + x."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x) * 0.5 + x


rows = 4096
cols = 2048


def get_inputs():
    x = torch.randn(rows, cols)
    return [x]


def get_init_inputs():
    return []
