"""How much rounding an honest fp32 kernel makes in each output of the reference: the length
of the reduction behind it (its fan-in), measured in the reference's process with float64
autograd, and the allowance the precision budget (``compare``) takes from it.

An honest fp32 kernel's rounding grows with the number of terms it sums per output element,
and with how much they cancel; the judge cannot see the reference's arithmetic, but the
float64 model can differentiate a few of its output elements with respect to the inputs:
the nonzero entries of the gradient count the input elements that element combines (a
matmul's ``out[i, j]`` has K per input), and the gradient times the input gives each
term's first-order share of the value (for a sum, or a product of inputs, the terms
themselves), whose squares against the squared output say how much the terms cancel.

Cost is bounded: one forward with autograd, then at most ``samples`` backward passes of one
element each, stopped once ``budget_s`` is spent. Where anything fails (an operator without
a float64 backward, outputs that are not differentiable, memory) the output gets None, and
the budget keeps its floor.

The rule (``allowance``), with u = 2^-24 and n at most 2^20: the relative-norm error may
reach ``s u sqrt(n (1/3 + rho/6))``, s = max(2, 0.6 q(lanes)), and an element may stray by
``6 u sqrt(n (1/3 + rho/6))`` times the output's root mean square.

Why: summing n terms in any order rounds each partial sum s_k once, so the error is about
u_e sqrt(sum_k s_k^2) with u_e ~ 0.45 u (rounding to nearest makes independent, unbiased
errors: the probabilistic analysis of Higham and Mary, 2019; the worst case, n u sum |x|,
needs every rounding to go one way). Terms in random order walk from 0 to the result S with
steps of the terms' root mean square, so the partial sums' mean square is S^2/3 + A^2/6,
A^2 the sum of the squared terms, and the error relative to the output is
u_e sqrt(n (1/3 + rho/6)), rho = A^2/S^2 (1 for independent zero-mean terms, ~1/n for terms
of one sign, large where they cancel). Measured on the CPU (row sums, matmuls with K = 64 to
2^19, softmax and layer-norm rows; normal, uniform and cancelling data; n = 64 to 2^20), a
serial sum reaches 0.35-0.55 of u sqrt(n (1/3 + rho/6)) over many lanes, fma-serial and
reversed sums as much, blocked, pairwise and Kahan sums less; 0.6 bounds it. The relative
norm of ``lanes`` independent errors exceeds its scale by the factor q(lanes) with
probability 1e-7 (the chi distribution's quantile, by Wilson and Hilferty: 5.8 for one lane,
3.2 for four, 1.5 for 64), so a scalar sum gets 3.5x the model and many lanes 2x.

What still fails (CPU emulations, and cuBLAS on an H100): rounding the inputs to TF32
(10 bits, to nearest, as cuBLAS TF32 does) or bf16 errs by about 0.6 x 2^-11 sqrt(rho)
(2^-8 for bf16) whatever n is, so on zero-mean data (``randn``; ``nn.Linear``'s weights)
an fp32 GEMM on TF32 inputs stays 24x over the budget at K = 16384 and 7x at 131072, and a
row sum of bf16 terms 9x at n = 2^20; biased rounding (truncated operands, bf16
accumulation) far more. What passes: on data of one sign (``rand``) rounding to nearest
averages out (rho ~ 1/n), so rounded inputs err less as n grows while an honest serial sum
errs more. A GEMM of ``rand`` inputs on H100 TF32 tensor cores errs 7.7e-6 at K = 2048,
5.9e-6 at 4096 and 4.1e-6 at 8192, a serial fp32 one 0.6e-6 to 1.2e-6: the floor (5e-6,
above the allowance there) fails the first two and passes the third, as without the
allowance; bf16 inputs pass from about n = 2^16, where the honest serial sum's error is
within a few times theirs and no norm bound fails the one without the other. A chain of
contractions over inputs (``a @ b @ c``) counts for ``b`` the product of the lengths, an
overcount the cap bounds (TF32 on zero-mean inputs still fails there). What fails
though honest: a serial fp32 sum of one-signed terms so long that the accumulator's ulp
nears the terms (a mean of 2^19 squares, or a layer-norm row of 2^20: 2.5x over) rounds
with a bias that grows like n u; an allowance that wide would let a mean skip a share of
its terms unseen, so such a sum must be blocked.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import torch

SAMPLES = 6
"""Output elements differentiated per output: the largest in magnitude (an element whose
path is active: ``relu`` zeroes the gradient of the others) and random others."""
BUDGET_S = 5.0
"""Seconds the measurement may take in all; the forward pass alone past a third of it
stops it before any backward pass."""
ROUNDING_UNIT = 2.0 ** -24
"""fp32's unit roundoff: honest kernels accumulate in fp32 at every declared precision."""
FAN_IN_CAP = 1 << 20
"""The longest reduction the allowance grows with."""
SERIAL = 0.6
"""A serial fp32 sum's error, at most, in units of ``rounding``."""
NORM_SPREAD = 2.0
"""The relative-norm allowance at least, in units of ``rounding``, however many lanes."""
ELEMENT_SPREAD = 6.0
"""The element-wise allowance in units of ``rounding`` x the root mean square: an element
near zero carries its terms' rounding, and among a million one lies 5 deviations out."""
TAIL_Z = 5.2
"""The normal quantile of probability 1e-7."""


def rounding(n: int, rho: float) -> float:
    """``u sqrt(n (1/3 + rho/6))``: the scale of an honest fp32 sum's relative error."""
    n = min(max(int(n), 1), FAN_IN_CAP)
    return ROUNDING_UNIT * math.sqrt(n * (1.0 / 3.0 + max(rho, 0.0) / 6.0))


def spread(lanes: int) -> float:
    """How many times ``rounding`` the relative norm of ``lanes`` independent errors may
    reach: SERIAL x the 1e-7 quantile of sqrt(chi^2_lanes / lanes), at least NORM_SPREAD."""
    d = max(int(lanes), 1)
    cube = (1.0 - 2.0 / (9.0 * d) + TAIL_Z * math.sqrt(2.0 / (9.0 * d))) ** 3
    return max(NORM_SPREAD, SERIAL * math.sqrt(cube))


def allowance(fan: FanIn, mean_square: float) -> tuple[float, float]:
    """(relative-norm allowance, element-wise allowance per unit of root mean square) of
    an output measured as ``fan``, in a trial whose float64 output has ``mean_square``:
    the cancellation measured is raised where the trial's output is smaller (a scalar sum
    that came out near zero: its terms are as large, its value is not)."""
    smaller = fan.mean_square / mean_square if mean_square > 0 else 1.0
    scale = rounding(fan.n, fan.rho * max(1.0, smaller))
    return spread(fan.lanes) * scale, ELEMENT_SPREAD * scale


@dataclass(frozen=True)
class FanIn:
    """One output's reduction: ``n``, the most input elements of one input that a sampled
    element combines; ``rho``, over the sampled elements, the sum of the squared terms
    (gradient x input, of that input) over the sum of their squared values (1 for sums of
    independent zero-mean terms, about 1/n for terms of one sign, large where they cancel;
    more generally the output's relative error per unit of independent relative error in
    every input, squared); ``mean_square``, the output's mean square at the inputs measured
    (a trial whose output is smaller has its terms, not its value: ``compare``); ``lanes``,
    at least how many independent reductions the output holds (that input's size over
    ``n``, at most the output's size: a softmax row's elements share one sum)."""

    n: int
    rho: float
    mean_square: float
    lanes: int

    def encode(self) -> list[float]:
        return [self.n, self.rho, self.mean_square, self.lanes]

    @classmethod
    def decode(cls, value: Any) -> FanIn | None:
        """A reported ``encode()``, or None where it is not one."""
        if not isinstance(value, (list, tuple)) or len(value) != 4 or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
            return None
        n, rho, mean_square, lanes = value
        if not (0 <= n < 2**62 and 0 <= lanes < 2**62 and 0 <= rho < float("inf")
                and 0 <= mean_square < float("inf")):
            return None
        return cls(int(n), float(rho), float(mean_square), int(lanes))


def report(model64: torch.nn.Module, inputs64: list[Any]) -> list[list[float] | None] | None:
    """``measure`` as the reference reports it (JSON: ``FanIn.encode()`` or null per
    output)."""
    measured = measure(model64, inputs64)
    return None if measured is None else [f.encode() if f else None for f in measured]


def decode(reported: Any) -> list[FanIn | None]:
    """The reference's ``report``, one ``FanIn`` or None per output (none where absent)."""
    if not isinstance(reported, list):
        return []
    return [FanIn.decode(value) for value in reported]


def measure(model64: torch.nn.Module, inputs64: list[Any], samples: int = SAMPLES,
            budget_s: float = BUDGET_S) -> list[FanIn | None] | None:
    """Each output's ``FanIn`` (None where it cannot be measured), or None where the model
    cannot be differentiated at all. ``inputs64`` are the float64 inputs of one trial; they
    are not changed, nor is ``model64`` (its parameters' ``requires_grad`` is restored)."""
    start = time.perf_counter()
    leaves = [x.detach().clone().requires_grad_(True)
              if isinstance(x, torch.Tensor) and x.is_floating_point() else None
              for x in inputs64]
    if not any(leaf is not None for leaf in leaves):
        return None
    params = [p for p in model64.parameters() if p.requires_grad]
    try:
        for p in params:  # gradients with respect to the inputs only
            p.requires_grad_(False)
        with torch.enable_grad():
            value = model64(*[leaf.clone() if leaf is not None else x  # in-place work allowed
                              for leaf, x in zip(leaves, inputs64, strict=True)])
            outputs = list(value) if isinstance(value, (tuple, list)) else [value]
            if time.perf_counter() - start > budget_s / 3:
                return None
            deadline = start + budget_s
            return [_one(out, [leaf for leaf in leaves if leaf is not None], samples, deadline)
                    for out in outputs]
    except Exception:  # no float64 backward, memory, a model that refuses autograd
        return None
    finally:
        for p in params:
            p.requires_grad_(True)


def _one(out: Any, leaves: list[torch.Tensor], samples: int, deadline: float
         ) -> FanIn | None:
    """``FanIn`` of one output tensor from its sampled elements' gradients."""
    if not isinstance(out, torch.Tensor) or not out.is_floating_point() \
            or not out.requires_grad or out.numel() == 0:
        return None
    flat = out.reshape(-1)
    values = flat.detach()
    most, rows = (0, 0.0, 1), []  # rows: (the element's squared value, its terms' squares)
    for index in _positions(values, samples):
        if time.perf_counter() > deadline and rows:
            break
        grads = torch.autograd.grad(flat[index], leaves, retain_graph=True, allow_unused=True)
        counts = [(int(torch.count_nonzero(g)), float((g * x.detach()).square().sum()),
                   x.numel()) for g, x in zip(grads, leaves, strict=True) if g is not None]
        best = max(counts, default=(0, 0.0, 1))
        most = max(most, best)
        rows.append((float(values[index]) ** 2, best[1]))
    if not rows:
        return None
    n, _, size = most
    mean_square = float(values.square().mean())
    lanes = min(values.numel(), max(size // max(n, 1), 1))
    return FanIn(n, _cancellation(rows, mean_square), mean_square, lanes)


def _cancellation(rows: list[tuple[float, float]], mean_square: float) -> float:
    """Sum of the terms' squares over sum of the squared values, over the random samples
    (the first, the largest element, is chosen by its value: ``softmax``'s largest has the
    largest terms too); all of them where the random ones are all zero (an inactive
    ``relu``), and against the whole output's mean square where the samples' values are."""
    random = rows[1:] if any(v or t for v, t in rows[1:]) else rows
    values, terms = sum(v for v, _ in random), sum(t for _, t in random)
    if values > 0:
        return terms / values
    return terms / len(random) / mean_square if mean_square > 0 else 0.0


def _positions(values: torch.Tensor, samples: int) -> list[int]:
    """The largest element in magnitude, then ``samples - 1`` others at fixed random places
    (the reference is trusted: where it looks needs no secret)."""
    first = int(values.abs().argmax())
    generator = torch.Generator().manual_seed(0)
    others = torch.randint(values.numel(), (max(samples - 1, 0),), generator=generator)
    return list(dict.fromkeys([first, *(int(i) for i in others)]))  # a scalar: once
