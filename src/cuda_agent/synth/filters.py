"""The task filters: one verdict per task, each failed filter named with its reason.

Run-time filters are measured in a worker process (``probe``); the static ones are here:
catalog-tagged stochastic operators, KernelBench near-copies (normalised-AST similarity)
and duplicates within the set. ``Checker`` combines them.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from cuda_agent.synth.config import FILTER_VERSION, FilterConfig
from cuda_agent.synth.probe import RUN_CHECKS
from cuda_agent.synth.runner import WorkerPool
from cuda_agent.synth.similarity import KernelBenchIndex, structure_key

CHECKS = (*RUN_CHECKS, "not_kernelbench_copy", "not_duplicate")


@dataclasses.dataclass(frozen=True)
class FilterVerdict:
    """Whether a task passed every filter; ``checks[name]`` is True when it passed that one
    (a filter not reached because an earlier one failed counts as not passed)."""

    accepted: bool
    reasons: tuple[str, ...]
    checks: dict[str, bool]
    metrics: dict[str, Any]
    device: str
    filter_version: str = FILTER_VERSION
    skipped: tuple[str, ...] = ()
    eager_ms: float | None = None
    compile_ms: float | None = None
    input_shapes: tuple[tuple[int, ...], ...] = ()
    output_shapes: tuple[tuple[int, ...], ...] = ()
    code: str | None = None
    """The code that was checked when it differs from the input (shrunk sizes)."""

    @property
    def reason_codes(self) -> tuple[str, ...]:
        return tuple(r.split(":", 1)[0] for r in self.reasons)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class Checker:
    """Runs every filter on task code; holds the KernelBench index and the set's keys."""

    def __init__(self, filters: FilterConfig, device: str, pool: WorkerPool,
                 kernelbench: Path | None = None, stochastic_ops: set[str] | None = None):
        self.filters = filters
        self.device = device
        self.pool = pool
        self.index = KernelBenchIndex.load(kernelbench) if kernelbench else None
        self.stochastic_ops = stochastic_ops or set()
        self.keys: dict[str, str] = {}  # structure key -> name of the task holding it

    def static(self, code: str, ops: tuple[str, ...] = (), name: str = "",
               exclude: str | None = None) -> tuple[dict[str, bool], list[str], dict[str, Any]]:
        """The cheap filters (no execution): stochastic tags, KernelBench, duplicates."""
        checks: dict[str, bool] = {}
        reasons: list[str] = []
        metrics: dict[str, Any] = {}
        tagged = [op for op in ops if op in self.stochastic_ops]
        checks["no_stochastic_ops"] = not tagged
        if tagged:
            reasons.append(f"no_stochastic_ops: catalog tags {tagged} as stochastic")
        if self.index is not None:
            score, label = self.index.best(code, exclude=exclude)
            metrics["kernelbench_similarity"] = round(score, 4)
            metrics["kernelbench_nearest"] = label
            checks["not_kernelbench_copy"] = score <= self.filters.similarity_threshold
            if score > self.filters.similarity_threshold:
                reasons.append(f"not_kernelbench_copy: normalised-AST similarity {score:.3f} "
                               f"to {label} is above {self.filters.similarity_threshold:g}")
        else:
            checks["not_kernelbench_copy"] = True
        key = structure_key(code)
        metrics["structure_key"] = key
        holder = self.keys.get(key)
        checks["not_duplicate"] = holder is None or holder == name
        if not checks["not_duplicate"]:
            reasons.append(f"not_duplicate: same normalised structure as {holder}")
        return checks, reasons, metrics

    def claim(self, code: str, name: str) -> None:
        """Record an accepted task so later duplicates of it are rejected."""
        self.keys.setdefault(structure_key(code), name)

    def release(self, code: str, name: str) -> None:
        if self.keys.get(structure_key(code)) == name:
            del self.keys[structure_key(code)]

    def check(self, code: str, ops: tuple[str, ...] = (), name: str = "", seed: int = 0,
              short_circuit: bool = False, exclude: str | None = None) -> FilterVerdict:
        """Every filter; with ``short_circuit`` a failed static filter skips execution (the
        run-time checks then read False: not passed, because not reached)."""
        checks, reasons, metrics = self.static(code, ops, name, exclude)
        skipped = () if self.index is not None else ("not_kernelbench_copy",)
        if short_circuit and reasons:
            for check in RUN_CHECKS:
                checks.setdefault(check, False)
            return FilterVerdict(False, tuple(reasons), _ordered(checks), metrics, self.device,
                                 skipped=skipped)
        result = self.pool.probe(code, self.filters.model_dump(), seed,
                                 self.filters.task_timeout_s)
        if "error" in result:
            for check in RUN_CHECKS:
                checks.setdefault(check, False)
            reasons.append(result["error"])  # already "timeout: ..." or "crash: ..."
            return FilterVerdict(False, tuple(reasons), _ordered(checks), metrics, self.device,
                                 skipped=skipped)
        for check, ok in result["checks"].items():
            checks[check] = checks.get(check, True) and ok
        reasons += result["reasons"]
        metrics.update(result["metrics"])
        return FilterVerdict(
            accepted=all(checks.values()), reasons=tuple(reasons), checks=_ordered(checks),
            metrics=metrics, device=self.device, skipped=skipped,
            eager_ms=result.get("eager_ms"), compile_ms=result.get("compile_ms"),
            input_shapes=tuple(tuple(s) for s in result.get("input_shapes", ())),
            output_shapes=tuple(tuple(s) for s in result.get("output_shapes", ())),
            code=result.get("code"))


def _ordered(checks: dict[str, bool]) -> dict[str, bool]:
    return {name: checks.get(name, False) for name in CHECKS}
