"""``cuda-agent eval TASKS ANSWERS --out DIR``, ``eval compare A B``, ``eval report RUN --audit A``.

``eval TASKS ANSWERS`` is short for ``eval run TASKS ANSWERS``: any first argument that is
not a sub-command name runs an evaluation.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer
from typer.core import TyperGroup

from cuda_agent.cli import overrides
from cuda_agent.cli.exits import bad_input
from cuda_agent.cli.render import console
from cuda_agent.cli.usage import one_of


class _RunByDefault(TyperGroup):
    def parse_args(self, ctx, args):
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = ["run", *args]
        return super().parse_args(ctx, args)


app = typer.Typer(cls=_RunByDefault, no_args_is_help=True, add_completion=False,
                  help="Stage 6 - evaluate: judge one answer per task; pass rate, faster "
                  "rates, geomean speed-ups, fast_p (docs/evaluation.md).")


AUDIT = typer.Option(None, "--audit", help="A `cuda-agent synth audit` folder: also show the "
                     "metrics without the problems it rejected, and list those.")


@app.command("run")
def run(
    tasks: str = typer.Argument(..., help="Task set: KernelBench JSONL or checkout, a folder, "
                                "a parquet/datasets folder, or builtin:NAME."),
    answers: Path = typer.Argument(..., help="Folder with one answer per task: NAME/ "
                                   "(model_new.py + kernels/) or NAME.py; also 1_19/ or 1_19.py."),
    out: Path = typer.Option(..., "--out", help="Output folder; rerunning resumes it."),
    device: str = typer.Option("auto", help="cpu, cuda, or auto (CUDA when a GPU is present).",
                                callback=one_of("auto", "cpu", "cuda")),
    gpus: str | None = typer.Option(None, help="GPU indices, e.g. '0,1' (default: all)."),
    cpu_workers: int = typer.Option(1, help="Judge workers when judging on the CPU."),
    trials: int | None = typer.Option(None, help="Correctness trials (default 5)."),
    no_compile: bool = typer.Option(False, "--no-compile", help="Skip the torch.compile baseline."),
    sets: list[str] = typer.Option([], "--set", help="Override KEY=VALUE of the eval config, "
                                   "repeatable (e.g. --set pool.judge.time_budget_s=5)."),
    audit: Path | None = AUDIT,
    quiet: bool = typer.Option(False, "--quiet", help="No progress bar."),
) -> None:
    """Judge each task's answer through the judge pool and write metrics, plots and a record."""
    from cuda_agent.evaluate import EvalConfig, run_eval, to_markdown
    from cuda_agent.execution import PoolConfig
    from cuda_agent.judge import JudgeConfig
    from cuda_agent.tasks import TaskError

    judge = JudgeConfig(device=device, time_compile=not no_compile)
    if trials is not None:
        judge = judge.model_copy(update={"trials": trials})
    gpu_list = [int(g) for g in gpus.split(",") if g.strip()] if gpus is not None else None
    pool = PoolConfig(gpus=gpu_list, cpu_workers=cpu_workers, judge=judge)
    config = overrides.apply(EvalConfig(pool=pool, audit=audit), sets)
    try:
        table = run_eval(tasks, answers, out, config, command=sys.argv, show_progress=not quiet)
    except (TaskError, FileNotFoundError, ValueError) as exc:
        raise bad_input(exc) from None
    shown = out / "metrics_audited.md" if audit else None
    console.print(shown.read_text() if shown else to_markdown(table), markup=False)
    console.print(f"written to {out}", markup=False)


@app.command("compare")
def compare(
    a: Path = typer.Argument(..., help="Output folder of the first run (holds metrics.json)."),
    b: Path = typer.Argument(..., help="Output folder of the second run."),
) -> None:
    """Compare two runs (Markdown): the verdict, the pass rate and the tasks that regressed
    first, geomeans over each run's correct answers beside those over all tasks and over
    the tasks correct in both; then both runs' tables per level, each cell 'A -> B'."""
    from cuda_agent.evaluate import compare_markdown, table_from_dict
    from cuda_agent.evaluate.compare import compare_runs, comparison_markdown
    from cuda_agent.evaluate.run import RESULTS, read_results, record_from_row

    tables, records = [], []
    for folder in (a, b):
        for name in ("metrics.json", RESULTS):
            if not (folder / name).is_file():
                raise bad_input(f"{folder / name}: not found; run `cuda-agent eval` first")
        tables.append(table_from_dict(json.loads((folder / "metrics.json").read_text())))
        records.append([record_from_row(row) for row in read_results(folder).values()])
    typer.echo(comparison_markdown(compare_runs(*records), str(a), str(b)))
    typer.echo(compare_markdown(tables[0], tables[1], str(a), str(b)))


@app.command("report")
def report(
    run_dir: Path = typer.Argument(..., help="Output folder of a run (holds results.jsonl)."),
    audit: Path = typer.Option(..., "--audit", help="A `cuda-agent synth audit` folder (holds "
                               "audit.jsonl)."),
) -> None:
    """Recompute a run's metrics with and without the problems the audit rejected; print both
    tables and the excluded problems, and write metrics_audited.md/.json into RUN_DIR."""
    from cuda_agent.evaluate import audited

    try:
        tables = audited.recompute(run_dir, audit)
    except FileNotFoundError as exc:
        raise bad_input(exc) from None
    audited.write(run_dir, tables)
    typer.echo(audited.audited_markdown(tables))
