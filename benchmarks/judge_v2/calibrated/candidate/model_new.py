"""y = tanh(x) * 0.5 + x in one fused CUDA kernel, slowed by a tunable delay.

A benchmark fixture: every thread of the kernel first takes a delay of ``CALIBRATED_SPIN``
units, which sets the kernel's time precisely. ``CALIBRATED_DELAY`` says what a unit is:
``spin`` (the default) an SM clock cycle of busy-waiting, ``stream`` a sixteenth of a
16-byte load per thread streamed from a scratch buffer (so the delay follows the memory
system, as the eager kernels do, not the SM clock). Both are read from the environment
when this module is imported; ``self.spin`` and ``self.mode`` may also be changed on an
instance.
"""

import os

import cuda_extension
import torch
import torch.nn as nn

SPIN = int(os.environ.get("CALIBRATED_SPIN", "0").strip() or "0")
MODES = {"spin": 0, "stream": 1}
DELAY = os.environ.get("CALIBRATED_DELAY", "spin").strip() or "spin"
if DELAY not in MODES:
    raise ValueError(f"CALIBRATED_DELAY must be one of {sorted(MODES)}, got {DELAY!r}")


class ModelNew(nn.Module):
    """Same function as the task's Model; no parameters."""

    def __init__(self):
        super().__init__()
        self.spin = SPIN
        self.mode = MODES[DELAY]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cuda_extension.calibrated(x.contiguous(), int(self.spin), int(self.mode))
