"""Benchmark metrics over per-task verdicts: pass rate, faster rates, geomean speed-ups, fast_p.

    records = [record_from_judge(result_dict, level=1), ...]
    table = compute_table(records)
    print(to_markdown(table))

Definitions (docs/evaluation.md): every rate is over ALL tasks of a level, an unanswered or
failed task counting as incorrect; "faster" uses the reward's margin (runtime < 0.95 x
baseline), "plainly faster" none; geometric means run over correct answers whose speed-up
is known. The overall row pools every task, which weights each level by its task count.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from typing import Any

FAST_P = (0.0, 0.5, 0.8, 1.0, 1.5, 2.0)
REWARDS = (-1, 1, 2, 3)
OVERALL = "overall"


@dataclasses.dataclass(frozen=True)
class TaskRecord:
    """One task's verdict, reduced to what the metrics need (times in milliseconds)."""

    task: str
    level: int | None
    correct: bool
    reward: int
    runtime_ms: float | None = None
    eager_ms: float | None = None
    compile_ms: float | None = None
    reason: str = ""

    @property
    def speedup_vs_eager(self) -> float | None:
        return _ratio(self.eager_ms, self.runtime_ms)

    @property
    def speedup_vs_compile(self) -> float | None:
        return _ratio(self.compile_ms, self.runtime_ms)


def record_from_judge(data: dict[str, Any], level: int | None = None) -> TaskRecord:
    """A ``TaskRecord`` from a ``JudgeResult`` in its ``to_dict`` (JSON) form."""
    reasons = data.get("reasons") or ()
    return TaskRecord(task=str(data["task"]), level=level, correct=bool(data["correct"]),
                      reward=int(data["reward"]), runtime_ms=data.get("runtime_ms"),
                      eager_ms=data.get("eager_ms"), compile_ms=data.get("compile_ms"),
                      reason="; ".join(reasons))


@dataclasses.dataclass(frozen=True)
class GroupMetrics:
    """Metrics of one level (or of all tasks). Rates are fractions in [0, 1]; a rate of an
    empty group and a geomean without any correct timed answer are None."""

    name: str
    tasks: int
    correct: int
    pass_rate: float | None
    faster_vs_eager: float | None
    faster_vs_compile: float | None
    plain_faster_vs_eager: float | None
    plain_faster_vs_compile: float | None
    geomean_vs_eager: float | None
    geomean_vs_compile: float | None
    fast_p_vs_eager: tuple[tuple[float, float | None], ...]
    fast_p_vs_compile: tuple[tuple[float, float | None], ...]
    rewards: tuple[tuple[int, int], ...]
    """How many tasks got each reward, for -1, 1, 2 and 3."""


@dataclasses.dataclass(frozen=True)
class EvalTable:
    """One evaluation: a row per level (ascending, tasks without a level last) and overall."""

    levels: tuple[GroupMetrics, ...]
    overall: GroupMetrics
    margin: float

    @property
    def rows(self) -> tuple[GroupMetrics, ...]:
        return (*self.levels, self.overall)


def level_name(level: int | None) -> str:
    return f"level {level}" if level is not None else "no level"


def compute_table(records: Iterable[TaskRecord], levels: Sequence[int] = (),
                  margin: float = 0.95, ps: Sequence[float] = FAST_P) -> EvalTable:
    """Metrics per level and overall; ``levels`` lists levels to show even when empty."""
    records = list(records)
    keys = {r.level for r in records} | set(levels)
    ordered = sorted(keys, key=lambda k: (k is None, k or 0))
    rows = tuple(group_metrics(level_name(k), [r for r in records if r.level == k], margin, ps)
                 for k in ordered)
    return EvalTable(rows, group_metrics(OVERALL, records, margin, ps), margin)


def group_metrics(name: str, records: Sequence[TaskRecord], margin: float = 0.95,
                  ps: Sequence[float] = FAST_P) -> GroupMetrics:
    n = len(records)
    ok = [r for r in records if r.correct]

    def rate(count: int) -> float | None:
        return count / n if n else None

    def faster(base: str, factor: float) -> float | None:
        return rate(sum(_beats(r, getattr(r, base), factor) for r in ok))

    eager = [s for s in (r.speedup_vs_eager for r in ok) if s is not None]
    compiled = [s for s in (r.speedup_vs_compile for r in ok) if s is not None]
    return GroupMetrics(
        name=name, tasks=n, correct=len(ok), pass_rate=rate(len(ok)),
        faster_vs_eager=faster("eager_ms", margin),
        faster_vs_compile=faster("compile_ms", margin),
        plain_faster_vs_eager=faster("eager_ms", 1.0),
        plain_faster_vs_compile=faster("compile_ms", 1.0),
        geomean_vs_eager=geomean(eager), geomean_vs_compile=geomean(compiled),
        fast_p_vs_eager=tuple((p, rate(sum(s > p for s in eager))) for p in ps),
        fast_p_vs_compile=tuple((p, rate(sum(s > p for s in compiled))) for p in ps),
        rewards=tuple((k, sum(r.reward == k for r in records)) for k in REWARDS),
    )


def fast_p(records: Sequence[TaskRecord], p: float, baseline: str = "eager") -> float | None:
    """Fraction of all ``records`` that are correct with a speed-up over ``baseline`` > p."""
    if not records:
        return None
    speed = [getattr(r, f"speedup_vs_{baseline}") for r in records if r.correct]
    return sum(s is not None and s > p for s in speed) / len(records)


def geomean(values: Sequence[float]) -> float | None:
    if not values:
        return None
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _beats(record: TaskRecord, baseline: float | None, factor: float) -> bool:
    return (record.runtime_ms is not None and baseline is not None
            and record.runtime_ms < factor * baseline)


def _ratio(base: float | None, value: float | None) -> float | None:
    if base is None or value is None or value <= 0 or base <= 0:
        return None
    return base / value


def table_to_dict(table: EvalTable) -> dict[str, Any]:
    return dataclasses.asdict(table)


def table_from_dict(data: dict[str, Any]) -> EvalTable:
    """Rebuild an ``EvalTable`` from ``table_to_dict`` (for example metrics.json)."""

    def group(d: dict[str, Any]) -> GroupMetrics:
        pairs = {k: tuple(tuple(x) for x in d[k])
                 for k in ("fast_p_vs_eager", "fast_p_vs_compile", "rewards")}
        return GroupMetrics(**{**d, **pairs})

    return EvalTable(tuple(group(g) for g in data["levels"]), group(data["overall"]),
                     float(data["margin"]))
