"""Summary of a synthesis run: ``summary.json``, ``summary.md``, ``runtime_hist.png`` and the
data-set card (``card``).

It covers the whole set in OUT, whichever sessions made it: counts per filter reason, the
ops-per-task and op-class mixes, operator coverage against the catalog, a runtime
histogram, and accepted tasks per hour over the sessions that accepted tasks (a rerun with
nothing left to do changes no figure).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

from cuda_agent.synth.catalog import COMPUTE_HEAVY, load_catalog, op_class
from cuda_agent.synth.config import FILTER_VERSION, PAPER_OPS_MIX, SynthConfig
from cuda_agent.synth.dataset import ROWS, SESSIONS, VERDICTS, read_jsonl


def throughput(out: Path) -> dict[str, Any]:
    """Accepted tasks per hour over the sessions that accepted tasks, and the last one."""
    sessions = read_jsonl(out / SESSIONS)
    made = [s for s in sessions if s["accepted"]]
    accepted = sum(s["accepted"] for s in made)
    seconds = sum(s["elapsed_s"] for s in made)
    last = sessions[-1] if sessions else {}
    return {"accepted": accepted, "elapsed_s": round(seconds, 1), "sessions": len(made),
            "accepted_per_hour": round(accepted / seconds * 3600, 1) if seconds else None,
            "last_session": {k: last.get(k) for k in ("accepted", "candidates", "elapsed_s",
                                                      "workers")}}


def reason_code(reason: str) -> str:
    """The filter a reason names; ``borderline <filter>`` for a refusal near a threshold."""
    parts = reason.split(":", 2)
    return f"borderline {parts[1].strip()}" if parts[0] == "borderline" else parts[0]


def row_classes(row: dict[str, Any], classes: dict[str, str]) -> list[str]:
    return row.get("op_classes") or [classes.get(op, "other") for op in row["ops"]]


def summarise(out: Path, config: SynthConfig) -> dict[str, Any]:
    rows = read_jsonl(out / ROWS)
    verdicts = read_jsonl(out / VERDICTS)
    rejected = [v for v in verdicts if not v["accepted"]]
    reasons = Counter(reason_code(r) for v in rejected for r in v["reasons"])
    first = Counter(reason_code(v["reasons"][0]) for v in rejected if v["reasons"])
    counts = Counter(len(r["ops"]) for r in rows)
    catalog = load_catalog(config.catalog)
    usable = {op.op for op in catalog if op.usable}
    classes = {op.op: op_class(op) for op in catalog}
    used = {op for r in rows for op in r["ops"]}
    times = [r["eager_ms"] for r in rows if r.get("eager_ms")]
    per_row = [row_classes(r, classes) for r in rows]
    class_counts = Counter(c for cs in per_row for c in cs)
    heavy = sum(any(c in COMPUTE_HEAVY for c in cs) for cs in per_row)
    sessions = read_jsonl(out / SESSIONS)
    kb = next((s["kernelbench"] for s in reversed(sessions) if "kernelbench" in s), None)
    return {
        "out": str(out), "device": config.device, "composer": config.composer,
        "filter_version": FILTER_VERSION, "wanted": config.count, "accepted": len(rows),
        "candidates": len(verdicts), "rejected": len(rejected),
        "acceptance_rate": round(len(rows) / len(verdicts), 4) if verdicts else None,
        "rejection_reasons": dict(reasons.most_common()),
        "first_rejection_reason": dict(first.most_common()),
        "ops_mix": {str(k): round(counts[k] / len(rows), 4) for k in sorted(counts)}
        if rows else {},
        "paper_ops_mix": {str(k): v for k, v in PAPER_OPS_MIX.items()},
        "data_source": dict(Counter(r["data_source"] for r in rows).most_common()),
        "op_coverage": {"distinct_ops": len(used), "composable_ops": len(usable),
                        "share": round(len(used & usable) / len(usable), 4) if usable else 0},
        "op_classes": {k: round(v / sum(class_counts.values()), 4)
                       for k, v in class_counts.most_common()},
        "compute_heavy_share": round(heavy / len(rows), 4) if rows else None,
        "kernelbench": kb or "skipped (no KernelBench copy found, or turned off)",
        "eager_ms": _quantiles(times),
        "window_ms": list(config.filters.window_ms(config.device)),
        "throughput": throughput(out),
    }


def _quantiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    data = sorted(values)
    pick = lambda q: data[min(len(data) - 1, int(q * len(data)))]  # noqa: E731
    return {"min": round(data[0], 3), "p50": round(pick(0.5), 3), "p90": round(pick(0.9), 3),
            "max": round(data[-1], 3)}


def write_summary(out: Path, config: SynthConfig) -> dict[str, Any]:
    from cuda_agent.synth.card import write_card

    summary = summarise(out, config)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    (out / "summary.md").write_text(markdown(summary))
    rows = read_jsonl(out / ROWS)
    histogram([r["eager_ms"] for r in rows if r.get("eager_ms")], out / "runtime_hist.png",
              config.filters.window_ms(config.device))
    write_card(out, summary, rows)
    return summary


def markdown(s: dict[str, Any]) -> str:
    lines = [f"# Synthesis run: {s['accepted']} of {s['wanted']} tasks", "",
             f"- device {s['device']}, composer {s['composer']}, filters {s['filter_version']}",
             f"- candidates {s['candidates']}, accepted {s['accepted']}, "
             f"rate {s['acceptance_rate']}",
             f"- throughput: {s['throughput']['accepted']} accepted in "
             f"{s['throughput']['elapsed_s']} s over {s['throughput']['sessions']} session(s) "
             f"that accepted tasks = {s['throughput']['accepted_per_hour']} accepted "
             "tasks/hour",
             f"- compute-heavy share: {s['compute_heavy_share']} of tasks hold a gemm, conv "
             "or attention operator",
             f"- KernelBench decontamination: {s['kernelbench']}",
             f"- op coverage: {s['op_coverage']['distinct_ops']} distinct ops used of "
             f"{s['op_coverage']['composable_ops']} composable",
             f"- eager ms: {s['eager_ms']}", "", "| rejection reason | candidates |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in s["rejection_reasons"].items()]
    lines += ["", "| ops per task | share | paper |", "|---|---|---|"]
    for k, v in s["paper_ops_mix"].items():
        lines.append(f"| {k} | {s['ops_mix'].get(k, 0)} | {v} |")
    lines += ["", "| op class | share of operators |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in s["op_classes"].items()]
    lines += ["", "![eager runtime](runtime_hist.png)", "", "Data-set card: [card.md](card.md)",
              ""]
    return "\n".join(lines)


def histogram(values: list[float], path: Path, window: tuple[float, float]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    if values:
        lo = math.log10(min(min(values), window[0]) / 1.5)
        hi = math.log10(max(max(values), window[1]) * 1.5)
        bins = [10 ** (lo + (hi - lo) * i / 30) for i in range(31)]
        ax.hist(values, bins=bins, color="#4477aa")
        ax.set_xscale("log")
    for edge in window:
        ax.axvline(edge, color="#cc3311", linestyle="--", linewidth=1)
    ax.set_xlabel("eager runtime (ms)")
    ax.set_ylabel("tasks")
    ax.set_title(f"{len(values)} accepted tasks")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
