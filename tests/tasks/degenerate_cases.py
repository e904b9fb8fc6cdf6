"""Small tasks for the degenerate-task rule, their trials drawn as the judge draws them, and
the judge-level expectation (``assert_verdict_flags``) for the judge's own tests to call.

A case is degenerate when a trivial answer (a constant, one repeated value per trial, an
input) passes the judge's comparison at every trial: 5 fresh draws and 2 with floating
inputs scaled by 0.25 and 4.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from typing import Any

import torch

TEMPLATE = '''
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def forward(self, {args}):
{body}


def get_inputs():
    return [{inputs}]


def get_init_inputs():
    return []
'''
FRESH, SCALES, SCALED_SEED = 5, (0.25, 4.0), 500


def task(body: str, inputs: str = "torch.randn(64, 256)", args: str = "x") -> str:
    """Task source whose forward runs ``body`` (statements; the last one returns)."""
    return TEMPLATE.format(args=args, inputs=inputs,
                           body=textwrap.indent(textwrap.dedent(body).strip(), " " * 8))


@dataclass(frozen=True)
class Case:
    """A task and the start of the reason it must be named by (None: not degenerate)."""

    code: str
    reason: str | None


CASES = {
    # softmax over rows of one element is 1 everywhere; the first output hides it from
    # a check of the outputs as a whole
    "constant": Case(task("return torch.tanh(x), torch.softmax(x, dim=1).sum(dim=1)"),
                     "degenerate task: a constant 1 passes as output 1"),
    # every 64 x 64 average of N(0, 1) values (x4 at most) rounds to 0
    "pool_round_zero": Case(
        task("return torch.round(F.adaptive_avg_pool2d(x, 1))", "torch.randn(8, 16, 64, 64)"),
        "degenerate task: a constant 0 passes as output 0"),
    # one value per trial: the sum, with a spread far below rtol * |sum|
    "repeated": Case(task("return torch.sum(x) + 1e-6 * x"),
                     "degenerate task: one repeated value (the trial's mean) passes as output 0"),
    "chain_matmul": Case(task("return torch.chain_matmul(x)"),
                         "degenerate task: input 0 passes as output 0"),
    # the input's elements in order: no input has the output's shape
    "flattened": Case(task("return torch.chain_matmul(x.flatten(1))", "torch.randn(64, 16, 16)"),
                      "degenerate task: input 0 read as shape (64, 256) passes as output 0"),
    "relu_signed": Case(task("return torch.relu(x)"), None),
    # the forward writes its answer into its input: the input as given does not pass
    "elu_in_place": Case(task("return F.elu_(x)"), None),
    "softmax_short_row": Case(task("return torch.softmax(x, dim=1)", "torch.randn(512, 4)"),
                              None),
    # every element is below atol, so a zero answer passes element-wise; the relative norm
    # check fails it
    "softmax_long_row": Case(task("return torch.softmax(x, dim=1)", "torch.randn(2, 100_000)"),
                             None),
    # 99.5% of the output rounds to 0, but a zero answer fails the +-1 elements at every
    # unscaled trial (it passes only the trial with inputs x0.25)
    "pool_round_sparse": Case(task("return torch.round(F.adaptive_avg_pool2d(x, 4))",
                                   "torch.randn(32, 64, 32, 16)"), None),
    # one norm per batch row over 65536 elements: within 1e-2 of each other, not 1e-4, and
    # the scaled trials move them all
    "norm_except_dim": Case(task("""
        x = torch.asinh(F.leaky_relu(x))
        return torch.norm_except_dim(x)
        """, "torch.randn(4, 64, 64, 16)"), None),
}


def trials(code: str, seed: int = 0, fresh: int = FRESH, scales: tuple[float, ...] = SCALES
           ) -> tuple[list[list[torch.Tensor]], list[list[Any]]]:
    """The reference's outputs and inputs at the judge's trials: draws ``seed + i`` for
    i < fresh, then ``seed + 500 + j`` with floating inputs multiplied by ``scales[j]``."""
    ns: dict[str, Any] = {"__name__": "degenerate_case"}
    exec(compile(code, "<case>", "exec"), ns)
    torch.manual_seed(seed)
    model = ns["Model"](*ns["get_init_inputs"]())
    plan = [(seed + i, 1.0) for i in range(fresh)]
    plan += [(seed + SCALED_SEED + j, s) for j, s in enumerate(scales)]
    outputs, inputs = [], []
    for draw, scale in plan:
        torch.manual_seed(draw)
        xs = [x * scale if isinstance(x, torch.Tensor) and x.is_floating_point() else x
              for x in ns["get_inputs"]()]
        pristine = [x.clone() if isinstance(x, torch.Tensor) else x for x in xs]
        with torch.no_grad():
            out = model(*xs)  # may write into xs
        outputs.append(list(out) if isinstance(out, tuple) else [out])
        inputs.append(pristine)
    return outputs, inputs


def assert_verdict_flags(result: Any, case: Case) -> None:
    """The judge-level rule: a verdict on ``case``'s task (``JudgeResult``, whatever the
    candidate) carries exactly one "degenerate task" flag, the reason
    ``cuda_agent.tasks.degenerate`` gives on the reference's trials, when the case is
    degenerate, and none otherwise."""
    named = [f for f in result.flags if f.startswith("degenerate task")]
    if case.reason is None:
        assert not named, f"an honest task flagged: {named}"
        return
    assert len(named) == 1, f"expected one degenerate-task flag, got {list(result.flags)}"
    assert named[0].startswith(case.reason), named[0]
    assert re.fullmatch(r".* at every trial \((\d+) of \1\)", named[0]), named[0]
