"""The data-set card written with a synthesized set: ``OUT/card.md`` and ``OUT/card/*.png``.

What a person checks before training on the set: how many tasks and from how many
candidates, the op-class and ops-count mixes (against the paper's), the share holding a
compute-heavy operator, the eager runtime distribution, why candidates were refused, and
ten sample tasks in full. Figures come from ``report.summarise``; plots are drawn with
matplotlib where a person would rather look than read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cuda_agent.synth.catalog import OP_CLASSES

PLOTS = Path("card")
SAMPLES = 10


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _bars(path: Path, labels: list[str], values: list[float], title: str, xlabel: str,
          reference: list[float] | None = None) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 3.6))
    spots = range(len(labels))
    width = 0.4 if reference else 0.8
    ax.bar([i - (width / 2 if reference else 0) for i in spots], values, width,
           color="#4477aa", label="this set")
    if reference:
        ax.bar([i + width / 2 for i in spots], reference, width, color="#bbbbbb",
               label="paper (CUDA-Agent-Ops-6K)")
        ax.legend()
    ax.set_xticks(list(spots), labels, rotation=30 if len(labels) > 6 else 0, ha="right"
                  if len(labels) > 6 else "center")
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _samples(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Ten rows evenly spread over the set (the same ten for the same set)."""
    if len(rows) <= SAMPLES:
        return rows
    return [rows[i * len(rows) // SAMPLES] for i in range(SAMPLES)]


def write_card(out: Path, summary: dict[str, Any], rows: list[dict[str, Any]]) -> Path:
    from cuda_agent.synth.report import histogram

    plots = out / PLOTS
    plots.mkdir(parents=True, exist_ok=True)
    classes = summary["op_classes"]
    order = [c for c in OP_CLASSES if c in classes]
    _bars(plots / "op_classes.png", order, [classes[c] for c in order],
          "operators by class", "op class (share of all operators)")
    counts = list(summary["paper_ops_mix"])
    _bars(plots / "ops_count.png", counts, [summary["ops_mix"].get(k, 0) for k in counts],
          "operators per task", "ops per task (share of tasks)",
          [summary["paper_ops_mix"][k] for k in counts])
    reasons = summary["first_rejection_reason"]
    _bars(plots / "rejections.png", list(reasons), list(reasons.values()),
          "first reason each refused candidate was refused for", "reason (candidates)")
    histogram([r["eager_ms"] for r in rows if r.get("eager_ms")], plots / "runtime.png",
              tuple(summary["window_ms"]))
    path = out / "card.md"
    path.write_text(_markdown(summary, rows))
    return path


def _markdown(s: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    t = s["throughput"]
    lines = [
        f"# Data-set card: {s['accepted']} synthesized tasks", "",
        f"- {s['accepted']} accepted of {s['candidates']} candidates "
        f"(rate {s['acceptance_rate']}); device {s['device']}, composer {s['composer']}, "
        f"filters {s['filter_version']}",
        f"- compute-heavy share: {s['compute_heavy_share']} of tasks hold a gemm, conv or "
        "attention operator",
        f"- {s['op_coverage']['distinct_ops']} distinct operators of "
        f"{s['op_coverage']['composable_ops']} composable; data sources {s['data_source']}",
        f"- eager runtime (ms): {s['eager_ms']}",
        f"- KernelBench decontamination: {s['kernelbench']}",
        f"- throughput: {t['accepted_per_hour']} accepted tasks/hour ({t['accepted']} in "
        f"{t['elapsed_s']} s over {t['sessions']} session(s))", "",
        "## Op classes", "", "![op classes](card/op_classes.png)", "",
        "| op class | share of operators |", "|---|---|",
        *[f"| {k} | {v} |" for k, v in s["op_classes"].items()], "",
        "## Operators per task", "", "![ops per task](card/ops_count.png)", "",
        "| ops | this set | paper |", "|---|---|---|",
        *[f"| {k} | {s['ops_mix'].get(k, 0)} | {v} |" for k, v in s["paper_ops_mix"].items()],
        "", "## Eager runtime", "", "![runtime](card/runtime.png)", "",
        "## Why candidates were refused", "", "![rejections](card/rejections.png)", "",
        "| first reason | candidates |", "|---|---|",
        *[f"| {k} | {v} |" for k, v in s["first_rejection_reason"].items()], "",
        f"## {min(SAMPLES, len(rows))} sample tasks", ""]
    for row in _samples(rows):
        lines += [f"### {row['name']}: {' -> '.join(row['ops'])}", "",
                  f"classes {row.get('op_classes')}, inputs {row.get('input_shapes')}, "
                  f"eager {row.get('eager_ms') and round(row['eager_ms'], 2)} ms", "",
                  "```python", row["code"].strip(), "```", ""]
    return "\n".join(lines)
