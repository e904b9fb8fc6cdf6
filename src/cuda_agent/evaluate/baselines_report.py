"""Summary and Markdown table of a baselines run (``cuda-agent baselines``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cuda_agent.evaluate.metrics import OVERALL, geomean, level_name

DASH = "-"


@dataclass(frozen=True)
class LevelBaselines:
    """One level's (or all tasks') baseline rows, counted."""

    name: str
    tasks: int
    measured: int
    cached: int
    errors: int
    seconds: float
    """Wall time spent on this group's rows (measuring, or reading the cache)."""
    geomean_compile_speedup: float | None
    """Geometric mean of eager / compile over the rows with both timed (> 1: compile wins)."""


@dataclass(frozen=True)
class BaselineSummary:
    """A baselines run: per level and overall; ``pending`` tasks are not done yet (time limit,
    or stopped)."""

    device: str
    selected: int
    pending: int
    levels: tuple[LevelBaselines, ...]
    overall: LevelBaselines

    @property
    def rows(self) -> tuple[LevelBaselines, ...]:
        return (*self.levels, self.overall)


def _group(name: str, rows: Sequence[dict[str, Any]]) -> LevelBaselines:
    ratios = [r["eager_ms"] / r["compile_ms"] for r in rows
              if r.get("eager_ms") and r.get("compile_ms")]
    return LevelBaselines(
        name=name, tasks=len(rows), measured=sum(r["source"] == "measured" for r in rows),
        cached=sum(r["source"] == "cached" for r in rows),
        errors=sum(r["source"] == "error" for r in rows),
        seconds=round(sum(r.get("seconds") or 0.0 for r in rows), 3),
        geomean_compile_speedup=geomean(ratios))


def summarize(rows: Sequence[dict[str, Any]], device: str, selected: int) -> BaselineSummary:
    """Count ``rows`` (the finished ones of ``selected`` tasks) per level and overall."""
    levels = sorted({r.get("level") for r in rows}, key=lambda k: (k is None, k or 0))
    groups = tuple(_group(level_name(k), [r for r in rows if r.get("level") == k])
                   for k in levels)
    return BaselineSummary(device, selected, selected - len(rows), groups,
                           _group(OVERALL, rows))


def _ms(value: float | None) -> str:
    return DASH if value is None else f"{value:.4g}"


def _pct(value: float | None) -> str:
    return DASH if value is None else f"{100 * value:.1f}"


def summary_markdown(summary: BaselineSummary) -> str:
    """The counts per level and overall."""
    done = summary.selected - summary.pending
    lines = [f"Baselines on {summary.device}: {done} of {summary.selected} tasks done"
             + (f", {summary.pending} pending." if summary.pending else "."), "",
             "| group | tasks | measured | cached | errors | seconds | eager/compile |",
             "|---|---|---|---|---|---|---|"]
    for g in summary.rows:
        speed = DASH if g.geomean_compile_speedup is None else f"{g.geomean_compile_speedup:.2f}x"
        lines.append(f"| {g.name} | {g.tasks} | {g.measured} | {g.cached} | {g.errors} | "
                     f"{g.seconds:.1f} | {speed} |")
    lines += ["", "eager/compile: geometric mean of eager time over torch.compile time "
              "(above 1: compile is faster)."]
    return "\n".join(lines) + "\n"


def to_markdown(summary: BaselineSummary, rows: Sequence[dict[str, Any]]) -> str:
    """The summary, then one line per task (errors with their reason)."""
    lines = ["| task | eager ms | ±% | compile ms | ±% | source | s | error |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        error = (r.get("error") or "").strip().split("\n")[0][:160].replace("|", "/")
        lines.append(f"| {r['key']} | {_ms(r.get('eager_ms'))} | {_pct(r.get('eager_rel_ci'))} "
                     f"| {_ms(r.get('compile_ms'))} | {_pct(r.get('compile_rel_ci'))} | "
                     f"{r['source']} | {r.get('seconds') or 0:.1f} | {error} |")
    lines += ["", "±%: half-width of the median's 95% confidence interval, in percent of it."]
    return summary_markdown(summary) + "\n" + "\n".join(lines) + "\n"
