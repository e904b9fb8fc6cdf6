"""Markdown tables of an evaluation, laid out like the paper's Table 1, and run comparisons."""

from __future__ import annotations

from cuda_agent.evaluate.metrics import EvalTable, GroupMetrics

COLUMNS = (
    ("pass", "pass_rate"),
    ("faster vs compile", "faster_vs_compile"),
    ("faster vs eager", "faster_vs_eager"),
    ("geomean vs compile", "geomean_vs_compile"),
    ("geomean vs eager", "geomean_vs_eager"),
)
DASH = "-"


def _cell(field: str, value: float | None) -> str:
    if value is None:
        return DASH
    return f"{value:.2f}x" if field.startswith("geomean") else f"{100 * value:.1f}"


def _label(row: GroupMetrics) -> str:
    return f"{row.name} ({row.tasks})"


def to_markdown(table: EvalTable) -> str:
    """Rows: each level then overall, with the task count; rates in percent."""
    lines = ["| | " + " | ".join(title for title, _ in COLUMNS) + " |",
             "|---" * (len(COLUMNS) + 1) + "|"]
    for row in table.rows:
        cells = [_cell(field, getattr(row, field)) for _, field in COLUMNS]
        lines.append(f"| {_label(row)} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(f"Rates in percent of all tasks; faster means correct and under "
                 f"{table.margin:g} x the baseline; geomean over correct answers.")
    return "\n".join(lines) + "\n"


def _delta(field: str, a: float | None, b: float | None) -> str:
    if a is None or b is None:
        return ""
    diff = b - a if field.startswith("geomean") else 100 * (b - a)
    unit = "x" if field.startswith("geomean") else ""
    return f" ({diff:+.2f}{unit})" if unit else f" ({diff:+.1f})"


def compare_markdown(a: EvalTable, b: EvalTable, name_a: str = "A", name_b: str = "B") -> str:
    """One table, each cell 'A -> B (delta)'; rows are the levels of either run, then overall."""
    rows_a = {row.name: row for row in a.rows}
    rows_b = {row.name: row for row in b.rows}
    names = [r.name for r in a.levels] + [r.name for r in b.levels if r.name not in rows_a]
    names = sorted(set(names), key=names.index) + [a.overall.name]
    lines = [f"Per level, {name_a} -> {name_b} (delta: percentage points, or x for geomeans; "
             "a geomean runs over each run's own correct answers)", "",
             "| | tasks | " + " | ".join(title for title, _ in COLUMNS) + " |",
             "|---" * (len(COLUMNS) + 2) + "|"]
    for name in names:
        ra, rb = rows_a.get(name), rows_b.get(name)
        tasks = f"{ra.tasks if ra else DASH} -> {rb.tasks if rb else DASH}"
        cells = []
        for _, field in COLUMNS:
            va = getattr(ra, field) if ra else None
            vb = getattr(rb, field) if rb else None
            cells.append(f"{_cell(field, va)} -> {_cell(field, vb)}{_delta(field, va, vb)}")
        lines.append(f"| {name} | {tasks} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
