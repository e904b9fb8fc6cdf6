"""Run every filter over a KernelBench set and report which problems are rejected and why.

    cuda-agent synth audit ../shared/kernelbench/kernelbench.jsonl --out runs/audit \\
        --max-numel 1048576 --no-compile

The KernelBench-similarity filter is off here (the problems are KernelBench); duplicates
are looked for within the set. On CPU, ``--max-numel`` shrinks the problems' size constants
first (``shrink``), and each row records what was changed.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from cuda_agent.synth.config import FilterConfig
from cuda_agent.synth.filters import Checker
from cuda_agent.synth.runner import WorkerPool
from cuda_agent.tasks.loaders import load_tasks


def audit(source: Path, out: Path, filters: FilterConfig, device: str = "cpu",
          workers: int = 2, levels: tuple[int, ...] = (1, 2, 3),
          progress: Callable[[int, int], None] | None = None) -> list[dict[str, Any]]:
    tasks = [t for t in load_tasks(str(source)) if t.level in levels]
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    with WorkerPool(workers, device) as pool:
        checker = Checker(filters, device, pool)
        owners: dict[str, str] = {}
        for task in tasks:  # duplicates: the first problem with a structure owns it
            key = checker.static(task.code, name=task.label)[2]["structure_key"]
            owners.setdefault(key, task.label)

        def one(task) -> dict[str, Any]:
            verdict = checker.check(task.code, name=task.label)
            key = verdict.metrics.get("structure_key")
            checks, reasons = dict(verdict.checks), list(verdict.reasons)
            if owners.get(key, task.label) != task.label:
                checks["not_duplicate"] = False
                reasons.append(f"not_duplicate: same normalised structure as {owners[key]}")
            return {"level": task.level, "problem_id": task.problem_id, "name": task.name,
                    "accepted": all(checks.values()), "reasons": reasons, "checks": checks,
                    "eager_ms": verdict.eager_ms, "shrunk": verdict.metrics.get("shrunk"),
                    "redundant_ops": verdict.metrics.get("redundant_ops")}

        with ThreadPoolExecutor(workers) as threads, (out / "audit.jsonl").open("w") as handle:
            for row in threads.map(one, tasks):
                rows.append(row)
                handle.write(json.dumps(row, default=str) + "\n")
                handle.flush()
                if progress:
                    progress(len(rows), len(tasks))
    (out / "audit.md").write_text(audit_markdown(rows, filters))
    return rows


def audit_markdown(rows: list[dict[str, Any]], filters: FilterConfig) -> str:
    lines = ["| level | problems | rejected | by filter (problems) |", "|---|---|---|---|"]
    for level in sorted({r["level"] for r in rows}):
        mine = [r for r in rows if r["level"] == level]
        bad = [r for r in mine if not r["accepted"]]
        by = Counter(reason.split(":", 1)[0] for r in bad for reason in
                     dict.fromkeys(x.split(":", 1)[0] for x in r["reasons"]))
        lines.append(f"| {level} | {len(mine)} | {len(bad)} | "
                     + ", ".join(f"{k} {v}" for k, v in by.most_common()) + " |")
    lines += ["", f"Inputs shrunk to at most {filters.max_numel} elements per tensor; "
              f"compile check {'on' if filters.compile_check else 'off'}.", "",
              "| problem | reasons |", "|---|---|"]
    for r in rows:
        if not r["accepted"]:
            text = "; ".join(x.replace("|", "/")[:160] for x in r["reasons"])
            lines.append(f"| L{r['level']}/{r['problem_id']} {r['name']} | {text} |")
    return "\n".join(lines) + "\n"
