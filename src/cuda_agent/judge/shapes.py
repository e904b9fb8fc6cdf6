"""One verdict from the verdicts at each input shape a task declares (``INPUT_SHAPES``).

The whole set is correct when every shape is; its times are sums over the shapes (the time
the user's model spends if each shape occurs once), so its speed-ups are ratios of sums; its
reward is the lowest shape's, so a kernel must earn the reward at every shape. Per-shape
verdicts stay in ``JudgeResult.shapes``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from cuda_agent.judge.record import _ratio
from cuda_agent.results import CorrectnessResult, JudgeResult, ShapeResult


def _total(results: Sequence[JudgeResult], attr: str) -> float | None:
    values = [getattr(r, attr) for r in results]
    return None if any(v is None for v in values) else sum(values)


def _merged(parts: Sequence[tuple[str, tuple[str, ...]]], count: int) -> tuple[str, ...]:
    """Messages of all shapes, each once, naming the shapes it came from unless it is all."""
    where: dict[str, list[str]] = {}
    for name, messages in parts:
        for message in messages:
            where.setdefault(message, []).append(name)
    return tuple(message if len(names) == count else f"[shape {', '.join(names)}] {message}"
                 for message, names in where.items())


def _correctness(results: Sequence[JudgeResult]) -> CorrectnessResult | None:
    found = [r.correctness for r in results if r.correctness is not None]
    if not found:
        return None
    abs_errors = [c.max_abs_error for c in found if c.max_abs_error is not None]
    rel_errors = [c.max_rel_error for c in found if c.max_rel_error is not None]
    return CorrectnessResult(
        correct=all(c.correct for c in found) and len(found) == len(results),
        trials=found[0].trials,
        max_abs_error=max(abs_errors) if abs_errors else None,
        max_rel_error=max(rel_errors) if rel_errors else None,
        atol=found[0].atol, rtol=found[0].rtol,
        reasons=tuple(dict.fromkeys(r for c in found for r in c.reasons)),
        checked_calls=sum(c.checked_calls for c in found))


def combine(parts: Sequence[tuple[str, JudgeResult]], declared: int) -> JudgeResult:
    """The set's verdict from ``(shape name, verdict)`` pairs; ``declared`` shapes exist
    (fewer parts mean the judgement stopped early, e.g. at a failed build)."""
    if not parts:
        raise ValueError("no shape was judged")
    results = [r for _, r in parts]
    first = results[0]
    runtime, eager = _total(results, "runtime_ms"), _total(results, "eager_ms")
    compiled_ms = _total(results, "compile_ms")
    shapes = tuple(ShapeResult(
        name=name, correct=r.correct, reward=r.reward, runtime_ms=r.runtime_ms,
        eager_ms=r.eager_ms, compile_ms=r.compile_ms, speedup_vs_eager=r.speedup_vs_eager,
        speedup_vs_compile=r.speedup_vs_compile, reasons=r.reasons) for name, r in parts)
    reasons = _merged([(name, r.reasons) for name, r in parts], len(parts))
    if len(parts) < declared:
        reasons += (f"judged {len(parts)} of {declared} input shapes: stopped at a failure",)
    phases: dict[str, float] = {}
    for r in results:
        for key, seconds in r.phases:
            phases[key] = round(phases.get(key, 0.0) + seconds, 4)
    correct = all(r.correct for r in results) and len(parts) == declared
    return dataclasses.replace(
        first, compiled=all(r.compiled for r in results), correct=correct,
        reward=min(r.reward for r in results), reasons=reasons,
        runtime_ms=runtime, eager_ms=eager, compile_ms=compiled_ms,
        speedup_vs_eager=_ratio(eager, runtime), speedup_vs_compile=_ratio(compiled_ms, runtime),
        build=next((r.build for r in results if r.build is not None), None),
        correctness=_correctness(results),
        flags=_merged([(name, r.flags) for name, r in parts], len(parts)),
        phases=tuple(phases.items()), shapes=shapes,
        baselines=tuple(dataclasses.replace(b, shape=name) for name, r in parts
                        for b in r.baselines),
        size=tuple(dict.fromkeys(c for r in results for c in r.size)))
