"""Shared pieces of the synthesis tests: a worker pool and small crafted tasks."""

from __future__ import annotations

import pytest

from cuda_agent.synth.config import FilterConfig
from cuda_agent.synth.runner import WorkerPool

TEMPLATE = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
{init}

    def forward(self, {args}):
{body}


def get_inputs():
    return [{inputs}]


def get_init_inputs():
    return []
'''


def task(body: str, inputs: str = "torch.randn(64, 256)", args: str = "x",
         init: str = "        pass") -> str:
    """A small task whose forward is ``body`` (indented by the caller's 8 spaces)."""
    return TEMPLATE.format(init=init, args=args, inputs=inputs,
                           body="\n".join("        " + line for line in body.splitlines()))


GOOD = task("return torch.tanh(x @ x.T) * 2.0 + x.sum(dim=1, keepdim=True)")


@pytest.fixture(scope="session")
def pool():
    with WorkerPool(2, "cpu", recycle_after=1000) as workers:
        yield workers


@pytest.fixture
def fast_filters() -> FilterConfig:
    """No torch.compile; a runtime window any small CPU task fits."""
    return FilterConfig(compile_check=False, min_ms_cpu=0.0, max_ms_cpu=10_000.0,
                        task_timeout_s=60)
