"""Compare candidate outputs with reference outputs, element-wise and by relative norm."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from cuda_agent.judge import fan_in as fan_in_
from cuda_agent.results import CorrectnessResult
from cuda_agent.tasks.tolerance import TOLERANCES, tolerance  # noqa: F401 (re-exported)

PRECISION_FACTOR = 16.0
"""A candidate may be this many times further from float64 than eager PyTorch is."""
PRECISION_FLOOR = {"fp32": 5e-6, "tf32": 2e-3, "bf16": 2e-2, "fp16": 4e-3}
"""...but always at least this far (relative norm), whatever eager's own error."""

WRONG = 0.05
"""A relative error this large is a wrong answer, not a precision question."""

CHUNK = 1 << 24
"""Elements compared at a time: float64 temporaries stay at a few hundred MB however large
the outputs are."""


def compare_trials(reference: list[list[torch.Tensor]], candidate: list[list[object]],
                   atol: float | None = None, rtol: float | None = None,
                   norm_from: int = 0, slack: list[list[float]] | None = None
                   ) -> CorrectnessResult:
    """Check every output of every trial; the first failure of each kind is reported.
    Trials from index ``norm_from`` on also get the relative-norm check (the earlier ones
    are judged against float64 instead, by ``precision_budget``). ``slack[trial][k]`` widens
    output k's element-wise bound by that much (``EagerError.slack``)."""
    reasons: list[str] = []
    max_abs = max_rel = 0.0
    used = (0.0, 0.0)
    for trial, (ref_outs, cand_outs) in enumerate(zip(reference, candidate, strict=True)):
        if len(ref_outs) != len(cand_outs):
            reasons.append(f"trial {trial}: {len(cand_outs)} outputs, expected {len(ref_outs)}")
            break
        for k, (ref, out) in enumerate(zip(ref_outs, cand_outs, strict=True)):
            where = f"trial {trial}, output {k}"
            if type(out) is not torch.Tensor:
                reasons.append(f"{where}: got {type(out).__name__}, expected a plain torch.Tensor")
                continue
            if out.shape != ref.shape or out.dtype != ref.dtype:
                reasons.append(f"{where}: got {out.dtype} {tuple(out.shape)}, "
                               f"expected {ref.dtype} {tuple(ref.shape)}")
                continue
            used = tolerance(ref.dtype, atol, rtol)
            extra = (slack[trial][k] if slack and trial < len(slack) and k < len(slack[trial])
                     else 0.0)
            problem, abs_err, rel_err = _check(ref, out, *used, trial >= norm_from, extra)
            max_abs, max_rel = max(max_abs, abs_err), max(max_rel, rel_err)
            if problem:
                reasons.append(f"{where}: {problem}")
        if reasons:
            break
    return CorrectnessResult(not reasons, len(reference), max_abs, max_rel, used[0], used[1],
                             tuple(reasons), checked_calls=len(reference))


def _chunks(*tensors: torch.Tensor):
    """Matching flat slices of equally sized tensors, CHUNK elements at a time."""
    flat = [t.reshape(-1) for t in tensors]
    for start in range(0, flat[0].numel(), CHUNK):
        yield [f[start:start + CHUNK] for f in flat]


def _check(ref: torch.Tensor, out: torch.Tensor, atol: float, rtol: float,
           norm_check: bool = True, slack: float = 0.0) -> tuple[str | None, float, float]:
    if not ref.is_floating_point():
        mismatched = sum(int((r != o).sum()) for r, o in _chunks(ref, out))
        return (f"{mismatched} elements differ" if mismatched else None), float(mismatched), 0.0
    zero = torch.zeros((), dtype=torch.float64, device=ref.device)
    out_nonfinite = ref_nonfinite = bad = zero.clone()
    abs_err, sq_diff, sq_ref = zero.clone(), zero.clone(), zero.clone()
    for r, o in _chunks(ref, out):
        if _all_finite(r, o):  # the usual case: no masks, float64 sums by dot products
            r64 = r.double()
            diff = _diff64(o, r64).abs_()
            if diff.numel():
                abs_err = torch.maximum(abs_err, diff.max())
            sq_diff = sq_diff + torch.dot(diff, diff)
            sq_ref = sq_ref + torch.dot(r64, r64)
            spent = r64 is not r  # a float64 reference chunk is not a copy: never written
            bound = (r64.abs_() if spent else r64.abs()).mul_(rtol).add_(atol + slack)
            bad = bad + (diff > bound).sum()
            continue
        r64, o64 = r.double(), o.double()
        finite = torch.isfinite(r64)
        out_nonfinite = out_nonfinite + (finite & ~torch.isfinite(o64)).sum()
        lost = ~finite & (r64.nan_to_num(0.0) != o64.nan_to_num(0.0))
        ref_nonfinite = ref_nonfinite + lost.sum()
        diff = (o64 - r64).abs().masked_fill_(~finite, 0.0)
        if diff.numel():
            abs_err = torch.maximum(abs_err, diff.max())
        sq_diff = sq_diff + diff.square().sum()
        sq_ref = sq_ref + r64.masked_fill(~finite, 0.0).square().sum()
        bad = bad + (diff > atol + slack + rtol * r64.abs()).sum()
    if float(out_nonfinite):
        return "non-finite values where the reference is finite", float("inf"), float("inf")
    if float(ref_nonfinite):
        return "non-finite reference values not reproduced", float("inf"), float("inf")
    abs_err_f, norm = float(abs_err), float(sq_ref.sqrt())
    rel_err = float(sq_diff.sqrt()) / norm if norm > 0 else abs_err_f
    if float(bad):
        widened = f" + rounding allowance {slack:.3g}" if slack else ""
        return (f"{int(bad)} of {ref.numel()} elements outside atol={atol:g}{widened}, "
                f"rtol={rtol:g} (max abs error {abs_err_f:.3g})"), abs_err_f, rel_err
    if norm_check and norm > 0 and rel_err > max(rtol, 1e-7):
        return f"relative norm error {rel_err:.3g} above {rtol:g}", abs_err_f, rel_err
    return None, abs_err_f, rel_err


def _floor(precision: str) -> float:
    """``PRECISION_FLOOR`` of ``precision`` (fp32's for any other)."""
    return PRECISION_FLOOR.get(precision, PRECISION_FLOOR["fp32"])


@dataclass(frozen=True)
class EagerError:
    """Eager's own output against its float64 twin: the relative norm error (the precision
    budget's scale), the largest element error and the twin's root mean square (the
    element-wise slack's); and the rounding an honest fp32 kernel may add in the output's
    reductions of ``terms`` terms (``fan_in.allowance``: by relative norm, and element-wise
    per unit of root mean square; 0 where the fan-in is unknown)."""

    rel: float
    worst: float
    rms: float
    allowance: float = 0.0
    element_allowance: float = 0.0
    terms: int = 1

    def budget(self, precision: str) -> float:
        """The precision budget: how far from float64 (relative norm) a candidate may be."""
        return max(PRECISION_FACTOR * self.rel, _floor(precision), self.allowance)

    def slack(self, precision: str) -> float:
        """How far past atol an honest kernel's element may stray at ``precision``.

        An element whose terms cancel (a row sum near zero) carries the rounding of its
        terms, not of its value: summing in another order moves it by about as much as
        eager's own error (16 x its largest), and summing terms rounded to a declared
        precision that eager kept in fp32 (autocast sums in fp32) by about that precision's
        relative error times the terms' size, which the precision budget's floor times the
        output's root mean square bounds: an error spread evenly at the floor passes. A long
        reduction's rounding (``fan_in.allowance``) is bounded the same way."""
        return max(PRECISION_FACTOR * self.worst,
                   max(_floor(precision), self.element_allowance) * self.rms)


def eager_errors(reference: list[list[torch.Tensor]], wide: list[list[torch.Tensor]] | None,
                 reported_fan_in: Any = None) -> list[list[EagerError | None]]:
    """Each twinned trial's outputs against their float64 twins (None where an output is
    not floating point or not shaped like its twin); one pass over each.

    ``reported_fan_in`` is the reference's fan-in report (``fan_in.report``, measured on
    inputs at scale 1; decoded here): where it names an output's reduction, that output's
    errors carry its ``fan_in.allowance``."""
    fans = fan_in_.decode(reported_fan_in)
    return [[_with_allowance(_errors(ref, ref64), fans[k] if k < len(fans) else None)
             if ref.is_floating_point() and ref64.is_floating_point()
             and ref.shape == ref64.shape else None
             for k, (ref, ref64) in enumerate(zip(refs, twins, strict=False))]
            for refs, twins in zip(reference, wide or [], strict=False)]


def _with_allowance(errors: tuple[float, float, float], fan: fan_in_.FanIn | None
                    ) -> EagerError:
    """One output's ``EagerError``, with the allowance of its reduction where known."""
    if fan is None:
        return EagerError(*errors)
    return EagerError(*errors, *fan_in_.allowance(fan, errors[2] ** 2), max(fan.n, 1))


def slack_of(errors: list[list[EagerError | None]], precision: str) -> list[list[float]]:
    """``compare_trials``' slack of each twinned trial's outputs (0 where there is none)."""
    return [[e.slack(precision) if e else 0.0 for e in row] for row in errors]


def timed_slack(errors: list[list[EagerError | None]], scales: list[float], precision: str
                ) -> list[float]:
    """The slack of each output for inputs at scale 1 (the timed sets): the largest over
    the twinned trials at scale 1."""
    fresh = [row for row, scale in zip(slack_of(errors, precision), scales, strict=False)
             if scale == 1.0]
    return [max(col) for col in zip(*fresh, strict=True)] if fresh else []


def _all_finite(*tensors: torch.Tensor) -> bool:
    """Every element of every tensor finite (one host sync, at the tensors' own dtypes)."""
    flags = [torch.isfinite(t).all() for t in tensors]
    return bool(torch.stack(flags).all()) if flags else True


def _diff64(out: torch.Tensor, ref64: torch.Tensor) -> torch.Tensor:
    """``out - ref64`` in float64, in a new tensor (``out`` itself is never written)."""
    return out.to(torch.float64, copy=True).sub_(ref64)


def _errors(out: torch.Tensor, ref64: torch.Tensor) -> tuple[float, float, float]:
    """Relative norm error and largest element error of ``out`` against ``ref64``, and
    ``ref64``'s root mean square, over the elements finite in both."""
    zero = torch.zeros((), dtype=torch.float64, device=ref64.device)
    sq_diff, sq_ref, worst, count = zero.clone(), zero.clone(), zero.clone(), zero.clone()
    for o, r in _chunks(out, ref64):
        r64 = r.double()
        if _all_finite(o, r):
            diff = _diff64(o, r64)
            sq_diff = sq_diff + torch.dot(diff, diff)
            sq_ref = sq_ref + torch.dot(r64, r64)
            count = count + r64.numel()
        else:
            o64 = o.double()
            finite = torch.isfinite(r64) & torch.isfinite(o64)
            sq_ref = sq_ref + r64.masked_fill(~finite, 0.0).square().sum()
            diff = (o64 - r64).masked_fill_(~finite, 0.0)
            sq_diff = sq_diff + diff.square().sum()
            count = count + finite.sum()
        if diff.numel():
            low, high = torch.aminmax(diff)
            worst = torch.maximum(worst, torch.maximum(-low, high))
    norm, n = float(sq_ref.sqrt()), float(count)
    return ((float(sq_diff.sqrt()) / norm if norm > 0 else 0.0), float(worst),
            (norm / n ** 0.5 if n > 0 else 0.0))


def precision_budget(eager: list[list[EagerError | None]], wide: list[list[torch.Tensor]],
                     candidate: list[list[torch.Tensor]], precision: str
                     ) -> tuple[list[str], float, float]:
    """Compare the candidate's error against float64 with eager's own error (a budget;
    ``eager_errors`` of the same trials).

    Returns (problems, worst candidate error, worst budget).
    """
    problems: list[str] = []
    worst_err = worst_budget = 0.0
    for trial, (errors, wides, cands) in enumerate(zip(eager, wide, candidate, strict=True)):
        for k, (own, ref64, out) in enumerate(zip(errors, wides, cands, strict=True)):
            if own is None:
                continue
            eager_err = own.rel
            budget = own.budget(precision)
            err, _, _ = _errors(out, ref64)
            worst_err, worst_budget = max(worst_err, err), max(worst_budget, budget)
            if err > budget and not problems:
                what = ("precision: computed at a lower precision than declared?"
                        if err < WRONG else "wrong result")
                problems.append(
                    f"{what} trial {trial}, output {k} is {err:.3g} from the float64 "
                    f"reference (relative norm); eager {precision} is {eager_err:.3g}, budget "
                    f"{budget:.3g}" + (f" (a reduction of {own.terms} terms allows "
                                       f"{own.allowance:.3g})" if own.allowance else ""))
    return problems, worst_err, worst_budget
