"""Rich rendering of results for the terminal, and JSON output."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.table import Table

from cuda_agent.results import BuildResult, JudgeResult, TimingStats, to_dict

console = Console(soft_wrap=True)
errors = Console(stderr=True, soft_wrap=True)


def judge_summary(result: JudgeResult) -> dict[str, Any]:
    """The stable JSON record of ``cuda-agent judge --json`` (plus nested details)."""
    data = to_dict(result)
    head = {k: data[k] for k in ("task", "device", "precision", "compiled", "correct", "reward",
                                 "reasons", "runtime_ms", "eager_ms", "compile_ms",
                                 "speedup_vs_eager", "speedup_vs_compile")}
    return {**head, **{k: v for k, v in data.items() if k not in head and k != "profile"}}


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=1, default=str))


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g} ms"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def print_judge(result: JudgeResult) -> None:
    table = Table(title=f"judge: {result.task} on {result.device} ({result.precision})",
                  show_header=False)
    colour = "green" if result.reward > 0 else "red"
    table.add_row("reward", f"[bold {colour}]{result.reward}[/]")
    table.add_row("compiled / correct", f"{result.compiled} / {result.correct}")
    if result.size:
        table.add_row("size", "reduced: " + ", ".join(f"{c.name} {c.full}->{c.judged}"
                                                     for c in result.size))
    spread = ""
    if result.shapes:
        spread = f"  (sum over {len(result.shapes)} input shapes)"
    elif result.timing is not None:
        spread = (f"  (95% CI {result.timing.ci_low_ms:.4g}-{result.timing.ci_high_ms:.4g}, "
                  f"{result.timing.runs} runs"
                  + (f", {result.timing.left_out} left out" + _why_left_out(result.timing)
                     if result.timing.left_out else "") + ")")
    table.add_row("candidate", _ms(result.runtime_ms) + spread)
    table.add_row("eager", f"{_ms(result.eager_ms)}  (speed-up {_x(result.speedup_vs_eager)})")
    table.add_row("torch.compile",
                  f"{_ms(result.compile_ms)}  (speed-up {_x(result.speedup_vs_compile)})")
    for line in baseline_lines(result):
        table.add_row("baselines", line)
    if result.correctness and result.correctness.checked_calls:
        table.add_row("checked", f"{result.correctness.checked_calls} calls "
                      f"(trials={result.correctness.trials} at scale 1, the rest at other "
                      "input scales or from other timing processes)")
    if result.correctness and result.correctness.max_abs_error is not None:
        table.add_row("max abs / rel-norm error", f"{result.correctness.max_abs_error:.3g} / "
                      f"{result.correctness.max_rel_error:.3g}")
    console.print(table)
    if result.shapes:
        print_shapes(result)
    for reason in result.reasons:
        console.print(f"  [yellow]-[/] {reason}", highlight=False)
    for flag in result.flags:
        console.print(f"  [magenta]flag:[/] {flag}", highlight=False)
    if result.seed is not None:
        console.print(f"  judged by {result.judge_version}, seed {result.seed}", highlight=False)
    if result.build and not result.build.ok:
        print_build(result.build)


ORIGINS = {"measured": "measured now", "cached": "cached", "remeasured":
           "cached, disagreed with the fresh check: measured again now",
           "judge": "measured by this judge earlier"}


def baseline_lines(result: JudgeResult) -> list[str]:
    """Where each set of the verdict's baselines came from, when and where they were
    measured, and the fresh check a cached one was held to."""
    lines = []
    for base in result.baselines:
        load = "" if base.load is None else f", load {base.load:.2f} on {base.cpus} CPUs"
        line = (f"{ORIGINS.get(base.source, base.source)} (at "
                f"{base.measured_at or 'an unknown time'} on {base.device_name or '?'}{load})")
        if base.check is not None:
            line += (f"; checked now: eager {base.check.median_ms:.4g} ms "
                     f"({base.check.ci_low_ms:.4g}-{base.check.ci_high_ms:.4g})")
        lines.append(f"shape {base.shape}: {line}" if base.shape else line)
    return lines


def print_shapes(result: JudgeResult) -> None:
    table = Table(title="per input shape")
    for column in ("shape", "correct", "reward", "candidate", "eager", "vs eager", "compile",
                   "vs compile"):
        table.add_column(column)
    for shape in result.shapes:
        table.add_row(shape.name, "yes" if shape.correct else "[red]no[/]", str(shape.reward),
                      _ms(shape.runtime_ms), _ms(shape.eager_ms), _x(shape.speedup_vs_eager),
                      _ms(shape.compile_ms), _x(shape.speedup_vs_compile))
    console.print(table)


def print_build(result: BuildResult) -> None:
    status = "[green]ok[/]" if result.ok else "[red]failed[/]"
    console.print(f"build {status} in {result.seconds:.2f} s: "
                  f"{len(result.compiled)} compiled, {len(result.cached)} cached")
    for diag in result.diagnostics:
        style = "red" if diag.severity in ("error", "fatal error") else "yellow"
        console.print(f"  [{style}]{diag}[/]", highlight=False, soft_wrap=True)
    if not result.ok and not result.diagnostics and result.log:
        console.print(result.log, highlight=False)


def _why_left_out(timing: TimingStats) -> str:
    """': device disturbed', ': queued late by the host', or both with their counts."""
    late, disturbed = timing.late, timing.left_out - timing.late
    if not late:
        return ": device disturbed"
    if not disturbed:
        return ": queued late by the host"
    return f": {disturbed} device disturbed, {late} queued late by the host"
