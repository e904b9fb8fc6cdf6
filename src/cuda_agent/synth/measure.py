"""What the run-time filters measure, and how a verdict near a threshold is refused.

Every threshold filter reports a score against its threshold; where the score passes but
lies within the filter's margin, the task is refused as ``borderline`` (the check fails
with a reason ``"borderline: <filter>: ..."``), because another input draw, another
machine load or another thread count could move it across, and ``synth check`` must
agree with the pipeline every time.
"""

from __future__ import annotations

import math
from typing import Any

import torch

SHARE_SAMPLE = 1 << 16
"""Elements (evenly strided) a constant share is measured on."""


class Report:
    """Per-check pass/fail with reasons and metrics, filled by the probe."""

    def __init__(self) -> None:
        self.checks: dict[str, bool] = {}
        self.reasons: list[str] = []
        self.metrics: dict[str, Any] = {}

    def set(self, name: str, ok: bool, why: str = "") -> bool:
        self.checks[name] = ok
        if not ok:
            self.reasons.append(f"{name}: {why}")
        return ok

    def judge(self, name: str, ok: bool, near: bool, why: str, margin: str) -> bool:
        """``name`` fails when not ``ok``, and is refused as borderline when ``ok`` but
        ``near`` its threshold (``margin`` says which band)."""
        self.checks[name] = ok and not near
        if not ok:
            self.reasons.append(f"{name}: {why}")
        elif near:
            self.reasons.append(f"borderline: {name}: {why}; {margin}")
        return self.checks[name]


def within(a: list[torch.Tensor], b: list[torch.Tensor], atol: float, rtol: float) -> bool:
    """Every element of ``a`` matches ``b`` within atol + rtol*|b| (a trivial answer passes)."""
    return score(a, b, atol, rtol) <= 1.0


def score(a: list[torch.Tensor], b: list[torch.Tensor], atol: float, rtol: float) -> float:
    """The largest |a - b| / (atol + rtol*|b|) over all elements: at most 1 where ``a``
    passes as ``b`` element-wise; inf for other shapes or a non-finite mismatch."""
    if len(a) != len(b) or any(x.shape != y.shape for x, y in zip(a, b, strict=True)):
        return math.inf
    worst = 0.0
    for x, y in zip(a, b, strict=True):
        if not x.numel():
            continue
        x, y = x.double(), y.double()
        finite = torch.isfinite(y)
        if bool((finite != torch.isfinite(x)).any()) or bool(
                (~finite & (x.nan_to_num(0.0) != y.nan_to_num(0.0))).any()):
            return math.inf
        diff = (x - y).abs().masked_fill_(~finite, 0.0)
        worst = max(worst, float((diff / (y.abs() * rtol + atol)).max()))
    return worst


def max_rel(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    diff = max(float((x.double() - y.double()).abs().max()) if x.numel() else 0.0
               for x, y in zip(a, b, strict=True))
    scale = max(float(y.double().abs().max()) if y.numel() else 0.0 for y in b)
    return diff / scale if scale else diff


def constant_share(out: torch.Tensor, atol: float, rtol: float) -> float:
    """The largest share of ``out``'s elements one constant (0 or their median) passes as
    at atol + rtol*|ref|, on an evenly strided sample: near 1 for an output that is
    almost all zeros or all one value."""
    if out.numel() < 2 or out.is_complex():
        return 0.0
    flat = out.reshape(-1)
    sample = flat[::max(1, flat.numel() // SHARE_SAMPLE)].double()
    sample = sample[torch.isfinite(sample)]
    if not sample.numel():
        return 0.0
    bound = sample.abs() * rtol + atol
    best = 0.0
    for value in (0.0, float(sample.median())):
        best = max(best, float(((sample - value).abs() <= bound).double().mean()))
    return best
