"""Metrics with and without the problems a task audit rejected (``cuda-agent synth audit``).

    cuda-agent eval report runs/eval1 --audit runs/audit

The audit's ``audit.jsonl`` holds one row per problem with ``accepted`` and its ``reasons``;
a rejected problem (degenerate: constant output, input-independent, duplicate...) is left
out of the second table, which is otherwise computed exactly like the first.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cuda_agent.evaluate.metrics import (
    FAST_P,
    EvalTable,
    TaskRecord,
    compute_table,
    table_to_dict,
)
from cuda_agent.evaluate.report import to_markdown

AUDIT_ROWS = "audit.jsonl"


@dataclasses.dataclass(frozen=True)
class AuditedTables:
    """The metrics of all tasks, and of the tasks the audit did not reject."""

    all: EvalTable
    kept: EvalTable
    excluded: tuple[tuple[str, str], ...]
    """(task key, the audit's reasons) of every evaluated task left out of ``kept``."""
    audit: str
    """The audit folder the rejections were read from."""


def record_key(record: TaskRecord) -> str:
    """A record's task key, as in results.jsonl: 'L1/19_ReLU', or the name without a level."""
    return f"L{record.level}/{record.task}" if record.level is not None else record.task


def load_rejected(audit: Path) -> dict[str, str]:
    """Task key -> reasons, for every problem ``audit/audit.jsonl`` did not accept."""
    path = Path(audit) / AUDIT_ROWS
    if not path.is_file():
        raise FileNotFoundError(f"{path}: not found; run `cuda-agent synth audit` first")
    rejected = {}
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        if not row.get("accepted", True):
            key = f"L{row['level']}/{row['name']}" if row.get("level") is not None \
                else row["name"]
            rejected[key] = "; ".join(row.get("reasons") or ()) or "rejected"
    return rejected


def audited_tables(records: Sequence[TaskRecord], rejected: dict[str, str],
                   levels: Sequence[int] = (), margin: float = 0.95,
                   ps: Sequence[float] = FAST_P, audit: str = "") -> AuditedTables:
    """Both tables over ``records``; the second without the tasks in ``rejected``."""
    kept = [r for r in records if record_key(r) not in rejected]
    excluded = tuple((record_key(r), rejected[record_key(r)]) for r in records
                     if record_key(r) in rejected)
    return AuditedTables(compute_table(records, levels, margin, ps),
                         compute_table(kept, levels, margin, ps), excluded, audit)


def to_dict(tables: AuditedTables) -> dict[str, Any]:
    return {"audit": tables.audit, "all": table_to_dict(tables.all),
            "without_rejected": table_to_dict(tables.kept),
            "excluded": [{"task": k, "reasons": r} for k, r in tables.excluded]}


def audited_markdown(tables: AuditedTables) -> str:
    """Both tables, then the excluded tasks with the audit's reasons."""
    lines = ["### All tasks", "", to_markdown(tables.all),
             f"### Without the {len(tables.excluded)} tasks the audit rejected"
             + (f" ({tables.audit})" if tables.audit else ""), "", to_markdown(tables.kept),
             "| excluded task | audit reasons |", "|---|---|"]
    lines += [f"| {key} | {reasons.replace('|', '/')[:300]} |" for key, reasons in tables.excluded]
    return "\n".join(lines) + "\n"


def write(out: Path, tables: AuditedTables) -> None:
    """``metrics_audited.json`` and ``metrics_audited.md`` in ``out``."""
    (out / "metrics_audited.json").write_text(json.dumps(to_dict(tables), indent=2) + "\n")
    (out / "metrics_audited.md").write_text(audited_markdown(tables))


def recompute(run: Path, audit: Path) -> AuditedTables:
    """Both tables of a finished ``cuda-agent eval`` folder (its results.jsonl, with the
    margin and fast_p thresholds of its metrics.json)."""
    from cuda_agent.evaluate.metrics import table_from_dict
    from cuda_agent.evaluate.run import read_results, record_from_row

    rows = read_results(Path(run))
    if not rows:
        raise FileNotFoundError(f"{run}: no results.jsonl rows; run `cuda-agent eval` first")
    rejected = load_rejected(audit)
    margin, ps = 0.95, FAST_P
    metrics = Path(run) / "metrics.json"
    if metrics.is_file():
        table = table_from_dict(json.loads(metrics.read_text()))
        margin, ps = table.margin, tuple(p for p, _ in table.overall.fast_p_vs_eager)
    records = [record_from_row(row) for row in rows.values()]
    return audited_tables(records, rejected, (), margin, ps, str(audit))
