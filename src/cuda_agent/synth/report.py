"""Summary of a synthesis run: ``summary.json``, ``summary.md`` and ``runtime_hist.png``.

Counts per filter reason, the ops-per-task mix against the paper's, operator coverage
against the catalog, a runtime histogram, and accepted tasks per hour of this session.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

from cuda_agent.synth.catalog import load_catalog
from cuda_agent.synth.config import FILTER_VERSION, PAPER_OPS_MIX, SynthConfig
from cuda_agent.synth.dataset import ROWS, VERDICTS, read_jsonl


def summarise(out: Path, config: SynthConfig, session_accepted: int, elapsed_s: float
              ) -> dict[str, Any]:
    rows = read_jsonl(out / ROWS)
    verdicts = read_jsonl(out / VERDICTS)
    rejected = [v for v in verdicts if not v["accepted"]]
    reasons = Counter(r.split(":", 1)[0] for v in rejected for r in v["reasons"])
    first = Counter(v["reasons"][0].split(":", 1)[0] for v in rejected if v["reasons"])
    counts = Counter(len(r["ops"]) for r in rows)
    usable = {op.op for op in load_catalog(config.catalog) if op.usable}
    used = {op for r in rows for op in r["ops"]}
    times = [r["eager_ms"] for r in rows if r.get("eager_ms")]
    hours = elapsed_s / 3600
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
        "eager_ms": _quantiles(times),
        "session": {"accepted": session_accepted, "elapsed_s": round(elapsed_s, 1),
                    "accepted_per_hour": round(session_accepted / hours, 1) if hours else None,
                    "workers": config.workers},
    }


def _quantiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    data = sorted(values)
    pick = lambda q: data[min(len(data) - 1, int(q * len(data)))]  # noqa: E731
    return {"min": round(data[0], 3), "p50": round(pick(0.5), 3), "p90": round(pick(0.9), 3),
            "max": round(data[-1], 3)}


def write_summary(out: Path, config: SynthConfig, session_accepted: int, elapsed_s: float
                  ) -> dict[str, Any]:
    summary = summarise(out, config, session_accepted, elapsed_s)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    (out / "summary.md").write_text(markdown(summary))
    rows = read_jsonl(out / ROWS)
    histogram([r["eager_ms"] for r in rows if r.get("eager_ms")], out / "runtime_hist.png",
              config.filters.window_ms(config.device))
    return summary


def markdown(s: dict[str, Any]) -> str:
    lines = [f"# Synthesis run: {s['accepted']} of {s['wanted']} tasks", "",
             f"- device {s['device']}, composer {s['composer']}, filters {s['filter_version']}",
             f"- candidates {s['candidates']}, accepted {s['accepted']}, "
             f"rate {s['acceptance_rate']}",
             f"- this session: {s['session']['accepted']} accepted in "
             f"{s['session']['elapsed_s']} s with {s['session']['workers']} workers = "
             f"{s['session']['accepted_per_hour']} accepted tasks/hour",
             f"- op coverage: {s['op_coverage']['distinct_ops']} distinct ops used of "
             f"{s['op_coverage']['composable_ops']} composable",
             f"- eager ms: {s['eager_ms']}", "", "| rejection reason | candidates |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in s["rejection_reasons"].items()]
    lines += ["", "| ops per task | share | paper |", "|---|---|---|"]
    for k, v in s["paper_ops_mix"].items():
        lines.append(f"| {k} | {s['ops_mix'].get(k, 0)} | {v} |")
    lines += ["", "![eager runtime](runtime_hist.png)", ""]
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
