"""The task filters: one verdict per task, each failed filter named with its reason.

Run-time filters are measured in a worker process (``probe``); the static ones are here:
catalog-tagged stochastic operators, KernelBench near-copies (normalised-AST similarity)
and duplicates within the set. ``Checker`` combines them. Decontamination runs against the
KernelBench copy found where the project keeps it (``find_kernelbench``) unless a set is
named or it is turned off; where none is found, ``checks["not_kernelbench_copy"]`` reads
``"skipped"``, never True.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Literal

from cuda_agent.synth.config import FILTER_VERSION, FilterConfig
from cuda_agent.synth.probe import RUN_CHECKS
from cuda_agent.synth.runner import WorkerPool
from cuda_agent.synth.similarity import KernelBenchIndex, structure_key

CHECKS = (*RUN_CHECKS, "not_kernelbench_copy", "not_duplicate")
SKIPPED = "skipped"
KERNELBENCH_PLACES = (Path("..") / "shared" / "kernelbench" / "kernelbench.jsonl",
                      Path(".bench") / "kernelbench.jsonl")
"""Where the project keeps its KernelBench copy, from the working folder (a checkout's
root, or a device machine's copy of it)."""


def find_kernelbench(setting: Path | Literal["auto"] | None) -> Path | None:
    """The KernelBench set to decontaminate against: ``setting`` itself when it is a path,
    none when None, and for ``"auto"`` the first of ``KERNELBENCH_PLACES`` that exists
    from the working folder or from this checkout's root."""
    if setting != "auto":
        return None if setting is None else Path(setting)
    root = Path(__file__).resolve().parents[3]
    for place in KERNELBENCH_PLACES:
        for base in (Path.cwd(), root):
            if (base / place).is_file():
                return (base / place).resolve()
    return None


def passed(value: bool | str) -> bool:
    """A check counts as passed when True or skipped (nothing to compare with)."""
    return value is True or value == SKIPPED


@dataclasses.dataclass(frozen=True)
class FilterVerdict:
    """Whether a task passed every filter; ``checks[name]`` is True when it passed that one
    (a filter not reached because an earlier one failed counts as not passed)."""

    accepted: bool
    reasons: tuple[str, ...]
    checks: dict[str, bool | str]
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
                 kernelbench: Path | Literal["auto"] | None = None,
                 stochastic_ops: set[str] | None = None):
        self.filters = filters
        self.device = device
        self.pool = pool
        self.kernelbench = find_kernelbench(kernelbench)
        self.index = KernelBenchIndex.load(self.kernelbench) if self.kernelbench else None
        self.stochastic_ops = stochastic_ops or set()
        self.keys: dict[str, str] = {}  # structure key -> name of the task holding it

    def static(self, code: str, ops: tuple[str, ...] = (), name: str = "",
               exclude: str | None = None
               ) -> tuple[dict[str, bool | str], list[str], dict[str, Any]]:
        """The cheap filters (no execution): stochastic tags, KernelBench, duplicates."""
        checks: dict[str, bool | str] = {}
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
            limit = self.filters.similarity_threshold
            low = limit - self.filters.similarity_margin
            checks["not_kernelbench_copy"] = score <= low
            if score > limit:
                reasons.append(f"not_kernelbench_copy: normalised-AST similarity {score:.3f} "
                               f"to {label} is above {limit:g}")
            elif score > low:
                reasons.append(f"borderline: not_kernelbench_copy: normalised-AST similarity "
                               f"{score:.3f} to {label} is within "
                               f"{self.filters.similarity_margin:g} of {limit:g}")
        else:
            checks["not_kernelbench_copy"] = SKIPPED
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
        run-time checks then read False: not passed, because not reached). Inputs are drawn
        from ``seed`` on; the pipeline leaves it at 0 for every task, so that `synth check`
        measures a task on the inputs the pipeline measured it on."""
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
            checks[check] = passed(checks.get(check, True)) and ok
        reasons += result["reasons"]
        metrics.update(result["metrics"])
        return FilterVerdict(
            accepted=all(passed(v) for v in checks.values()), reasons=tuple(reasons),
            checks=_ordered(checks),
            metrics=metrics, device=self.device, skipped=skipped,
            eager_ms=result.get("eager_ms"), compile_ms=result.get("compile_ms"),
            input_shapes=tuple(tuple(s) for s in result.get("input_shapes", ())),
            output_shapes=tuple(tuple(s) for s in result.get("output_shapes", ())),
            code=result.get("code"))


def _ordered(checks: dict[str, bool | str]) -> dict[str, bool | str]:
    return {name: checks.get(name, False) for name in CHECKS}
