"""A result folder laid out as ``cuda-agent optimize`` writes it, from the shipped CPU
solution of the built-in example (no agent run), and a small model built from its task."""

from __future__ import annotations

import json
import runpy
import shutil
from pathlib import Path

import torch
from torch import nn

from cuda_agent.tasks.loaders import builtin_dir

EXAMPLE = builtin_dir() / "gelu_bias_scale"
FEATURES = 1024  # the task's get_init_inputs(): (1024, 0.5)


def make_result(out: Path, device: str = "cpu") -> Path:
    """OUT/result/{model_new.py,kernels/} and OUT/workspace/model.py (the example's solution
    for ``device``)."""
    shutil.copytree(EXAMPLE / "solution" / device, out / "result")
    (out / "workspace" / ".cuda-agent").mkdir(parents=True)
    shutil.copy2(EXAMPLE / "model.py", out / "workspace" / "model.py")
    (out / "workspace" / ".cuda-agent" / "workspace.json").write_text(
        json.dumps({"task": "gelu_bias_scale", "device": device}))
    return out


def task_model() -> type[nn.Module]:
    """The example task's ``Model`` (bias, exact GELU, scale), as a user's class."""
    return runpy.run_path(str(EXAMPLE / "model.py"))["Model"]


class Block(nn.Module):
    def __init__(self, act: nn.Module):
        super().__init__()
        self.proj = nn.Linear(FEATURES, FEATURES)
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.proj(x))


class Net(nn.Module):
    """Two blocks, each a Linear then the task's module; returns a dict."""

    def __init__(self, scale: float = 0.5):
        super().__init__()
        model = task_model()
        self.blocks = nn.ModuleList([Block(model(FEATURES, scale)) for _ in range(2)])

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        hidden = [x]
        for block in self.blocks:
            hidden.append(block(hidden[-1]))
        return {"out": hidden[-1], "hidden": tuple(hidden[1:])}
