"""y = tanh(x) * 0.5 + x in one fused CUDA kernel, slowed by a tunable busy-wait.

A benchmark fixture: every thread of the kernel first spins ``CALIBRATED_SPIN`` SM clock
cycles (read from the environment when this module is imported; default 0), which sets the
kernel's time precisely. ``self.spin`` may also be changed on an instance.
"""

import os

import cuda_extension
import torch
import torch.nn as nn

SPIN = int(os.environ.get("CALIBRATED_SPIN", "0").strip() or "0")


class ModelNew(nn.Module):
    """Same function as the task's Model; no parameters."""

    def __init__(self):
        super().__init__()
        self.spin = SPIN

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cuda_extension.calibrated(x.contiguous(), int(self.spin))
