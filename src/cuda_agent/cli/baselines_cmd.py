"""``cuda-agent baselines TASKS --out DIR``: time and cache every task's eager and compile
baselines on this device (docs/evaluation.md)."""

from __future__ import annotations

from pathlib import Path

import typer

from cuda_agent.cli import exits, overrides
from cuda_agent.cli.exits import bad_input
from cuda_agent.cli.render import console
from cuda_agent.cli.usage import one_of


def _ints(text: str | None) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip()) if text else ()


def _shard(text: str) -> tuple[int, int]:
    k, sep, n = text.partition("/")
    if not sep or not k.isdigit() or not n.isdigit() or not 0 <= int(k) < int(n):
        raise typer.BadParameter(f"--shard {text!r}: expected K/N with 0 <= K < N, e.g. 0/4")
    return int(k), int(n)


def baselines(
    tasks: str = typer.Argument(..., help="Task set: KernelBench JSONL or checkout, a folder, "
                                "a parquet/datasets folder, or builtin:NAME."),
    out: Path = typer.Option(..., "--out", help="Output folder; rerunning resumes it."),
    device: str = typer.Option("auto", help="cpu, cuda, or auto (CUDA when a GPU is present).",
                                callback=one_of("auto", "cpu", "cuda")),
    no_compile: bool = typer.Option(False, "--no-compile", help="Skip the torch.compile baseline "
                                    "(cached under another key than with it)."),
    levels: str | None = typer.Option(None, help="Comma-separated levels, e.g. 1,2 (default all)."),
    limit: int | None = typer.Option(None, help="At most this many tasks (after --levels)."),
    workers: int = typer.Option(1, help="Tasks measured at once; CPU only (a GPU timing needs "
                                "the whole GPU)."),
    shard: str = typer.Option("0/1", help="K/N: only every N-th task from the K-th (--gpus "
                              "runs one shard per GPU by itself)."),
    gpus: str = typer.Option("auto", help="GPUs to spread the tasks over, one process each: "
                             "auto (every visible GPU, on CUDA), a count, or indices such as "
                             "0,2."),
    time_limit: float | None = typer.Option(None, "--time-limit", help="Seconds; start no task "
                                            "after this, the rest stays pending for a rerun."),
    retry_errors: bool = typer.Option(False, "--retry-errors", help="Measure again the tasks "
                                      "whose row is an error."),
    sets: list[str] = typer.Option([], "--set", help="Override KEY=VALUE of the baselines "
                                   "config, repeatable (e.g. --set judge.time_budget_s=5)."),
    report_only: bool = typer.Option(False, "--report-only", help="Measure nothing: rewrite "
                                     "the summary and table from the rows already in --out."),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bar."),
) -> None:
    """Measure eager and torch.compile timings of every task in clean processes and store them
    in the judge's baseline cache, so later `eval`/`judge` runs on this device reuse them."""
    from cuda_agent.evaluate.baselines import BaselinesConfig, run_baselines
    from cuda_agent.evaluate.baselines_report import summary_markdown
    from cuda_agent.judge import JudgeConfig
    from cuda_agent.judge.judge import JudgeError
    from cuda_agent.tasks import TaskError

    config = BaselinesConfig(judge=JudgeConfig(device=device, time_compile=not no_compile),
                             levels=_ints(levels), limit=limit, workers=workers,
                             shard=_shard(shard), time_limit_s=time_limit,
                             retry_errors=retry_errors)
    config = overrides.apply(config, sets)
    try:
        if not report_only and config.shard == (0, 1) and _spread(
                tasks, out, config, gpus, device, no_compile, levels, limit, time_limit,
                retry_errors, sets, quiet):
            report_only = True  # the shards measured it all: only the summary is left
        summary = run_baselines(tasks, out, config, show_progress=not quiet,
                                measure=not report_only)
    except (TaskError, JudgeError, ValueError) as exc:
        raise bad_input(exc) from None
    console.print(summary_markdown(summary), markup=False, soft_wrap=True)
    console.print(f"written to {out}", markup=False)


def _spread(tasks: str, out: Path, config, gpus: str, device: str, no_compile: bool,
            levels: str | None, limit: int | None, time_limit: float | None,
            retry_errors: bool, sets: list[str], quiet: bool) -> bool:
    """Measure in one process per GPU when there are several; False when there are not."""
    from rich.progress import Progress

    from cuda_agent.evaluate.baselines import select_tasks
    from cuda_agent.evaluate.baselines_spread import cli_child, spread, visible_gpus
    from cuda_agent.judge.judge import resolve_device

    if gpus == "auto" and not resolve_device(device).startswith("cuda"):
        return False
    try:
        chosen = visible_gpus(gpus)
    except ValueError as exc:
        raise bad_input(exc) from None
    if len(chosen) < 2:
        return False
    options = [tasks, "--out", str(out), "--device", device, *(["--no-compile"] * no_compile),
               *(["--levels", levels] if levels else []),
               *(["--limit", str(limit)] if limit is not None else []),
               *(["--time-limit", str(time_limit)] if time_limit else []),
               *(["--retry-errors"] * retry_errors),
               *(part for s in sets for part in ("--set", s))]
    total = len(select_tasks(tasks, config))
    Path(out).mkdir(parents=True, exist_ok=True)
    console.print(f"{total} tasks over {len(chosen)} GPUs ({', '.join(chosen)}), one "
                  f"process each", markup=False)
    with Progress(disable=quiet) as bar:
        shown = bar.add_task("baselines (rows written)", total=total)
        codes = spread(chosen, cli_child(options), Path(out), total,
                       lambda n: bar.update(shown, completed=n))
    failed = [f"GPU {g}: exit {c}" for g, c in zip(chosen, codes, strict=True) if c]
    if failed:
        raise exits.failed(f"shards failed ({'; '.join(failed)}); a rerun resumes them")
    return True
