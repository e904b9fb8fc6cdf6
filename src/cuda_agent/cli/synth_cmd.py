"""``cuda-agent synth``: make a task data set; ``synth check|catalog|audit`` sub-commands."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from cuda_agent.cli import overrides
from cuda_agent.cli.exits import REFUSED, bad_input
from cuda_agent.cli.render import console, errors, print_json
from cuda_agent.cli.usage import one_of
from cuda_agent.synth.config import FilterConfig, SynthConfig

app = typer.Typer(help="Stage 0 - task synthesis: crawl seed operators, compose tasks, "
                       "filter them, write a CUDA-Agent-Ops data set.",
                  invoke_without_command=True)

DEVICE = typer.Option("cpu", help="Where tasks run and are timed: cpu or cuda.",
                      callback=one_of("cpu", "cuda"))
KERNELBENCH_HELP = ("KernelBench JSONL or checkout to decontaminate against; auto: the copy at "
                    "../shared/kernelbench when found (verdicts say skipped when not); off.")
SET = typer.Option([], "--set", help="Override any config field: KEY=VALUE (e.g. "
                   "filters.max_ms_cpu=50).")


def _bar() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=console)


def _kernelbench(value: str) -> Path | str | None:
    """The --kernelbench value as the config takes it: auto, None (off) or a path."""
    if value in ("auto", "off"):
        return None if value == "off" else value
    if not Path(value).exists():
        raise bad_input(f"--kernelbench {value}: no such file or folder (auto or off, or a "
                        "KernelBench JSONL or checkout)")
    return Path(value)


@app.callback(invoke_without_command=True)
def synth(ctx: typer.Context,
          count: int = typer.Option(30, help="Accepted tasks wanted."),
          out: Path | None = typer.Option(None, help="Output folder (resumes if it exists)."),
          device: str = DEVICE,
          composer: str = typer.Option("rules", help="rules (no LLM) or llm."),
          workers: int = typer.Option(2, help="Parallel worker processes."),
          seed: int = typer.Option(0, help="Base seed."),
          kernelbench: str = typer.Option("auto", help=KERNELBENCH_HELP),
          compile_check: bool = typer.Option(True, "--compile/--no-compile",
                                             help="Check torch.compile (slow on CPU)."),
          set_: list[str] = SET) -> None:
    """Synthesize COUNT tasks into OUT (run `synth check TASK.py` for one task)."""
    if ctx.invoked_subcommand is not None:
        return
    if out is None:
        raise bad_input("--out DIR is required (or use a sub-command, see --help)")
    from cuda_agent.synth.pipeline import Pipeline

    config = overrides.apply(SynthConfig(
        count=count, device=device, composer=composer, workers=workers, seed=seed,
        kernelbench=_kernelbench(kernelbench), filters=FilterConfig(compile_check=compile_check)),
        set_)
    with _bar() as bar:
        job = bar.add_task("accepted", total=config.count)

        def show(accepted: int, candidates: int, total: int) -> None:
            bar.update(job, completed=accepted,
                       description=f"accepted ({candidates} candidates)")

        try:
            summary = Pipeline(config, out, on_progress=show).run()
        except (ValueError, FileNotFoundError) as exc:
            raise bad_input(exc) from None
    console.print(f"{summary['accepted']} tasks in {out} ({summary['candidates']} candidates, "
                  f"{summary['throughput']['accepted_per_hour']} accepted/hour); "
                  f"see {out / 'summary.md'} and {out / 'card.md'}")


@app.command("check")
def check(task: str = typer.Argument(..., help="A task: FILE.py or PATH::SELECTOR."),
          kernelbench: str = typer.Option("auto", help=KERNELBENCH_HELP),
          device: str = DEVICE,
          as_json: bool = typer.Option(False, "--json", help="Print the verdict as JSON."),
          max_numel: int | None = typer.Option(None, help="Shrink size constants first."),
          compile_check: bool = typer.Option(True, "--compile/--no-compile"),
          set_: list[str] = SET) -> None:
    """Run every filter on one task and print the verdict (exit 1 when rejected)."""
    from cuda_agent.synth.filters import Checker
    from cuda_agent.synth.runner import WorkerPool
    from cuda_agent.tasks import TaskError, load_task

    try:
        loaded = load_task(task)
    except TaskError as exc:
        raise bad_input(exc) from None
    filters = overrides.apply(FilterConfig(compile_check=compile_check, max_numel=max_numel),
                              set_)
    with WorkerPool(1, device) as pool:
        verdict = Checker(filters, device, pool, _kernelbench(kernelbench)).check(
            loaded.code, loaded.ops, loaded.name)
    if as_json:
        print_json(verdict.to_dict())
    else:
        table = Table("filter", "passed", title=f"synth check: {task}")
        for name, ok in verdict.checks.items():
            table.add_row(name, "[green]yes[/]" if ok else "[red]no[/]")
        console.print(table)
        for reason in verdict.reasons:
            console.print(f"  [yellow]-[/] {reason}", highlight=False)
        colour = "green" if verdict.accepted else "red"
        console.print(f"[{colour}]{'accepted' if verdict.accepted else 'rejected'}[/]"
                      f" (eager {verdict.eager_ms} ms on {device})")
    if not verdict.accepted:
        raise typer.Exit(REFUSED)


@app.command("recheck")
def recheck_cmd(out: Path = typer.Argument(..., help="A synthesized set's folder."),
                times: int = typer.Option(3, help="Re-checks of every accepted task."),
                workers: int | None = typer.Option(None, help="Worker processes (default: "
                                                   "the run's).")) -> None:
    """Re-check every accepted task TIMES times with the run's filters: all must agree."""
    from cuda_agent.synth.stability import recheck

    if not (out / "run" / "config.json").is_file():
        raise bad_input(f"{out}: no synthesized set here (run/config.json is missing)")
    with _bar() as bar:
        job = bar.add_task("re-checks", total=None)
        result = recheck(out, times, workers,
                         progress=lambda done, total: bar.update(job, completed=done,
                                                                 total=total))
    console.print(f"{result['stable']} of {result['tasks']} tasks accepted at all {times} "
                  f"re-checks ({result['refusals']} refusals: {result['reasons']}); see "
                  f"{out / 'recheck.json'}")
    if result["refused_tasks"]:
        raise typer.Exit(REFUSED)


@app.command("catalog")
def catalog(out: Path | None = typer.Option(None, help="Catalog file (default: the shipped "
                                            "one inside the package)."),
            workers: int = typer.Option(2, help="Parallel crawler processes."),
            transformers: bool = typer.Option(True, help="Also crawl transformers blocks.")
            ) -> None:
    """Crawl torch (and transformers) operators, confirm each by execution, write the
    catalog and print coverage."""
    from cuda_agent.synth import crawl_hf
    from cuda_agent.synth.catalog import coverage, default_catalog_path, write_catalog
    from cuda_agent.synth.crawl import crawl

    if transformers and not crawl_hf.available():
        errors.print(f"[yellow]note:[/] {crawl_hf.MISSING}")
    with _bar() as bar:
        job = bar.add_task("operators", total=None)
        ops = crawl(workers=workers, transformers=transformers,
                    progress=lambda done, total: bar.update(job, completed=done, total=total))
    path = out or default_catalog_path()
    write_catalog(ops, path)
    print_json({"catalog": str(path), **coverage(ops)})


@app.command("audit")
def audit_cmd(source: Path = typer.Argument(..., help="KernelBench JSONL or checkout."),
              out: Path = typer.Option(Path("synth-audit"), help="Report folder."),
              levels: str = typer.Option("1,2,3", help="Comma-separated levels."),
              device: str = DEVICE,
              max_numel: int | None = typer.Option(1 << 20, help="Shrink size constants so "
                                                   "every tensor holds at most this many."),
              workers: int = typer.Option(2, help="Parallel worker processes."),
              compile_check: bool = typer.Option(False, "--compile/--no-compile"),
              set_: list[str] = SET) -> None:
    """Run `synth check` over KernelBench and report rejected problems with reasons."""
    from cuda_agent.synth.audit import audit

    filters = overrides.apply(FilterConfig(compile_check=compile_check, max_numel=max_numel,
                                           max_ms_cpu=1e9, min_ms_cpu=0.0), set_)
    with _bar() as bar:
        job = bar.add_task("problems", total=None)
        rows = audit(source, out, filters, device, workers,
                     tuple(int(x) for x in levels.split(",")),
                     progress=lambda done, total: bar.update(job, completed=done, total=total))
    bad = [r for r in rows if not r["accepted"]]
    console.print(f"{len(bad)} of {len(rows)} problems rejected; see {out / 'audit.md'}")
