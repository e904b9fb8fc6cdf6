"""Element-wise tolerances by output dtype: an output passes where |out - ref| <= atol +
rtol * |ref| and its relative norm error is at most rtol.

The judge's comparison and synthesis's degenerate-task check read this one table, so a
task refused as degenerate is refused at the tolerance its candidates are judged by.
"""

from __future__ import annotations

import torch

TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-4, 1e-4),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (2e-2, 2e-2),
}
"""(atol, rtol) by output dtype; any other dtype (integers, bool) is compared exactly."""


def tolerance(dtype: torch.dtype, atol: float | None, rtol: float | None) -> tuple[float, float]:
    """(atol, rtol) for outputs of ``dtype``: the given ones, or the table's where None."""
    default = TOLERANCES.get(dtype, (0.0, 0.0))
    return (default[0] if atol is None else atol, default[1] if rtol is None else rtol)


PRECISION_TOLERANCE = {"tf32": (5e-3, 5e-3), "bf16": (5e-2, 5e-2), "fp16": (1e-2, 1e-2)}
"""(atol, rtol) of a task that declares a lower precision, whatever the output dtype."""


def declared(precision: str, atol: float | None = None, rtol: float | None = None
             ) -> tuple[float | None, float | None]:
    """``atol``/``rtol``, or where None the declared precision's (None again for fp32:
    the output dtype's own, ``TOLERANCES``)."""
    if precision in PRECISION_TOLERANCE:
        atol = PRECISION_TOLERANCE[precision][0] if atol is None else atol
        rtol = PRECISION_TOLERANCE[precision][1] if rtol is None else rtol
    return atol, rtol
