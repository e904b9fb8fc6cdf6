"""Is a task degenerate? Some trivial answer passes the judge's comparison at every trial.

    reason = degenerate(outputs, inputs)  # outputs[trial][k], inputs[trial][i]; None: not

    check = Degeneracy()                  # or trial by trial, dropping inputs as you go
    check.add(outputs, inputs)
    reason = check.reason()

A candidate returning a trivial answer instead of computing the task would be judged
correct, so such a task pays its reward for nothing. It is found by execution on the
reference's own trials, output by output, never by a list of operators. Three kinds:

- a constant: one value per output, the same at every trial (0, and the first trial's
  median, mean and mid-range);
- a repeated value: the output filled with one value per trial (that trial's mean, median
  or mid-range), for outputs of more than one element;
- an input: an input tensor with the output's shape, or its number of elements read in
  order, cast to the output's dtype (never broadcast).

An answer passes a trial where the judge's comparison (``cuda_agent.judge.compare``) would
pass it as a candidate's output: integer, bool and complex outputs exactly; floating ones
element-wise within atol + rtol * |ref|, non-finite values compared as the judge compares
them, and with relative norm error at most max(rtol, 1e-7). The judge's trials include
inputs scaled by 0.25 and 4; a constant rarely passes both.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from cuda_agent.tasks.tolerance import tolerance

CHUNK = 1 << 22
"""Elements compared at a time: float64 temporaries stay at tens of MB whatever the size."""
FIRST_LOOK = 1 << 16
"""Evenly strided elements ``passes`` looks at first: one of them failing settles it."""
SAMPLE = 1 << 20
"""A median is taken over at most this many evenly strided elements."""
STATS = ("mean", "median", "middle")


@dataclass(frozen=True)
class Stats:
    """One output at one trial, over its finite elements (all 0 where it has none)."""

    mean: float
    median: float
    middle: float
    """Half-way between the smallest and largest value: the constant nearest to all."""


@dataclass(frozen=True)
class Answer:
    """A trivial answer for output ``output``: a constant ``value``, the trial's ``stat``
    repeated, or input ``source`` (its elements in order)."""

    output: int
    label: str
    value: float | None = None
    stat: str | None = None
    source: int | None = None

    def at(self, ref: torch.Tensor, inputs: Sequence[Any], own: Stats | None
           ) -> float | torch.Tensor | None:
        """This answer at one trial (``own``: ``ref``'s stats): a scalar filling the
        output, a tensor of its number of elements, or None where the trial has none."""
        if self.value is not None:
            return self.value
        if self.stat is not None:
            return getattr(own or stats(ref), self.stat)
        if self.source is None or self.source >= len(inputs):
            return None
        found = inputs[self.source]
        if isinstance(found, torch.Tensor) and found.numel() == ref.numel():
            return found
        return None


class Degeneracy:
    """The trivial answers that still pass after the trials seen so far; a trial's inputs
    and outputs are not kept."""

    def __init__(self, atol: float | None = None, rtol: float | None = None):
        self.atol, self.rtol = atol, rtol
        self.trials = 0
        self.alive: list[Answer] | None = None

    def add(self, outputs: Sequence[Any], inputs: Sequence[Any]) -> None:
        """One trial's outputs (the reference's) and the inputs they were computed from,
        as they were before the forward ran (a forward may write into its inputs)."""
        own = {k: stats(ref) for k, ref in enumerate(outputs) if isinstance(ref, torch.Tensor)
               and (self.alive is None or any(a.stat and a.output == k for a in self.alive))}
        if self.alive is None:
            self.alive = [a for k, ref in enumerate(outputs) if isinstance(ref, torch.Tensor)
                          for a in answers(k, ref, inputs, own[k])]
        self.trials += 1
        self.alive = [a for a in self.alive if a.output < len(outputs)
                      and isinstance(ref := outputs[a.output], torch.Tensor)
                      and passes(ref, a.at(ref, inputs, own.get(a.output)),
                                 self.atol, self.rtol)]

    @property
    def open(self) -> bool:
        """Whether some answer may still pass (before any trial, every one may)."""
        return self.alive is None or bool(self.alive)

    def reason(self) -> str | None:
        """A one-line reason naming the first answer that passed every trial, or None."""
        if not self.alive or not self.trials:
            return None
        first, n = self.alive[0], self.trials
        return (f"degenerate task: {first.label} passes as output {first.output} at every "
                f"trial ({n} of {n})")


def degenerate(outputs: Sequence[Sequence[Any]], inputs: Sequence[Sequence[Any]],
               atol: float | None = None, rtol: float | None = None) -> str | None:
    """``Degeneracy``'s reason for these trials: ``outputs[t][k]`` is output k of trial t,
    ``inputs[t]`` trial t's inputs; atol and rtol default to the output dtype's
    (``tolerance.TOLERANCES``)."""
    check = Degeneracy(atol, rtol)
    for outs, ins in zip(outputs, inputs, strict=True):
        check.add(outs, ins)
    return check.reason()


def answers(k: int, ref: torch.Tensor, inputs: Sequence[Any], first: Stats) -> list[Answer]:
    """The trivial answers for output ``k`` made from its first trial (``ref``, with stats
    ``first``): constants, inputs, then repeated values, the order they name a task in."""
    exact = not ref.is_floating_point()
    values = [0.0, first.median, first.mean, first.middle]
    if exact:  # compared exactly: only a value the output holds can pass
        values = [0.0] if ref.is_complex() else [0.0, first.median]
    found: list[Answer] = []
    for value in dict.fromkeys(_in_dtype(v, ref.dtype) for v in values):
        if not (isinstance(value, float) and math.isnan(value)):
            found.append(Answer(k, f"a constant {value:.6g}", value=value))
    for i, x in enumerate(inputs):
        if isinstance(x, torch.Tensor) and x.numel() == ref.numel():
            label = f"input {i}"
            if x.shape != ref.shape:
                label += f" read as shape {tuple(ref.shape)}"
            if x.dtype != ref.dtype:
                label += f" cast to {str(ref.dtype).removeprefix('torch.')}"
            found.append(Answer(k, label, source=i))
    if ref.numel() > 1 and not ref.is_complex():
        for name in ("median",) if exact else STATS:
            found.append(Answer(k, f"one repeated value (the trial's {name})", stat=name))
    return found


def _scalar(value: float | int | bool) -> torch.Tensor:
    """``value`` as a 0-dim tensor, float64 for a float (float32 would round it)."""
    return torch.tensor(value, dtype=torch.float64 if isinstance(value, float) else None)


def _in_dtype(value: float, dtype: torch.dtype) -> float | int | bool | complex:
    """``value`` as an element of ``dtype`` holds it (what a candidate's output can hold)."""
    return _scalar(value).to(dtype).item()


def stats(ref: torch.Tensor) -> Stats:
    """Mean, median (of a strided sample) and mid-range of ``ref``'s finite elements."""
    if ref.numel() == 0 or ref.is_complex():
        return Stats(0.0, 0.0, 0.0)
    flat = ref.reshape(-1)
    wide = torch.float64 if ref.is_floating_point() else torch.int64
    zero = torch.zeros((), dtype=torch.float64, device=ref.device)
    total, count = zero.clone(), zero.clone()
    low = torch.full((), math.inf, dtype=torch.float64, device=ref.device)
    high = -low
    for start in range(0, flat.numel(), CHUNK):
        part = flat[start:start + CHUNK].to(torch.float64)
        part = part[torch.isfinite(part)]
        if part.numel():
            total, count = total + part.sum(), count + part.numel()
            low, high = torch.minimum(low, part.min()), torch.maximum(high, part.max())
    sample = flat[::max(1, -(-flat.numel() // SAMPLE))].to(wide)
    if wide is torch.float64:
        sample = sample[torch.isfinite(sample)]
    total, count, low, high = torch.stack([total, count, low, high]).tolist()
    if not count:
        return Stats(0.0, 0.0, 0.0)
    return Stats(total / count, sample.median().item(), (low + high) / 2)


def passes(ref: torch.Tensor, answer: float | torch.Tensor | None,
           atol: float | None = None, rtol: float | None = None) -> bool:
    """Whether ``answer`` (a scalar filling the output, or a tensor of its number of
    elements, cast to its dtype) passes the judge's comparison against ``ref``."""
    if answer is None or (isinstance(answer, torch.Tensor) and answer.numel() != ref.numel()):
        return False
    flat = ref.reshape(-1)
    whole = answer.reshape(-1) if isinstance(answer, torch.Tensor) else None
    fill = None if whole is not None else _scalar(answer).to(ref.device, ref.dtype)
    if not ref.is_floating_point():
        for start in range(0, flat.numel(), CHUNK):
            r = flat[start:start + CHUNK]
            a = fill if whole is None else whole[start:start + CHUNK].to(r.device, r.dtype)
            if bool((r != a).any()):
                return False
        return True
    atol, rtol = tolerance(ref.dtype, atol, rtol)

    def part(r: torch.Tensor, a: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Elements failing, squared error and squared reference of matching slices."""
        r, a = r.double(), a.to(r.device, ref.dtype).double()
        finite = torch.isfinite(r)
        lost = ~finite & (r.nan_to_num(0.0) != a.nan_to_num(0.0))  # not reproduced
        diff = (a - r).abs().masked_fill_(~finite, 0.0)
        bad = ((finite & ~torch.isfinite(a)).sum() + lost.sum()
               + (diff > r.abs().mul_(rtol).add_(atol)).sum())
        return bad, diff.square().sum(), r.masked_fill(~finite, 0.0).square().sum()

    # one failing element fails the answer: a strided sample settles most answers at once
    stride = max(1, flat.numel() // FIRST_LOOK)
    if bool(part(flat[::stride], fill if whole is None else whole[::stride])[0]):
        return False
    zero = torch.zeros((), dtype=torch.float64, device=ref.device)
    bad, sq_diff, sq_ref = zero.clone(), zero.clone(), zero.clone()
    for start in range(0, flat.numel(), CHUNK):
        terms = part(flat[start:start + CHUNK],
                     fill if whole is None else whole[start:start + CHUNK])
        bad, sq_diff, sq_ref = bad + terms[0], sq_diff + terms[1], sq_ref + terms[2]
    bad_f, sq_diff_f, sq_ref_f = torch.stack([bad, sq_diff, sq_ref]).tolist()
    if bad_f:
        return False
    norm = math.sqrt(sq_ref_f)
    return not (norm > 0 and math.sqrt(sq_diff_f) / norm > max(rtol, 1e-7))
