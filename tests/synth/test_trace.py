"""The ATen tracer finds no-op, constant-making and dead operators by running them."""

from __future__ import annotations

import torch
import torch.nn as nn

from cuda_agent.synth.trace import trace_redundancy


class Redundant(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 8)
        self.unused = nn.Linear(8, 4)

    def forward(self, x):
        x = torch.relu(self.fc(x))
        x = nn.functional.leaky_relu(x)  # no-op after relu
        self.unused(x)  # dead
        m = x.max(dim=1, keepdim=True).values
        return torch.tanh(x) + (m - m.mean(dim=1, keepdim=True))  # the difference is 0


class Clean(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.bn = nn.BatchNorm2d(8)
        self.norm = nn.LayerNorm(8)

    def forward(self, x):
        x = self.bn(self.conv(x)).permute(0, 2, 3, 1)
        x = self.norm(x)
        x[:, 0] += 1  # in-place on a view is live, not dead
        return torch.softmax(x, -1)


def test_finds_each_kind():
    found = " | ".join(trace_redundancy(Redundant(), [torch.randn(4, 16)], 0.0, 0.0))
    assert "leaky_relu returns its input unchanged" in found
    assert "never reaches the output" in found
    assert "turns a varying input into the constant" in found


def test_clean_model_has_no_findings():
    assert trace_redundancy(Clean(), [torch.randn(2, 3, 10, 10)], 0.0, 0.0) == []
