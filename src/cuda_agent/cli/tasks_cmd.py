"""``cuda-agent tasks``: list, show and check tasks in any supported format."""

from __future__ import annotations

import typer
from rich.table import Table

from cuda_agent.cli.render import console, errors, print_json
from cuda_agent.tasks import TaskError, load_task, load_tasks
from cuda_agent.tasks.inspect import inspect_task

app = typer.Typer(help="Stage 1 - tasks: list, show and check KernelBench-format tasks.",
                  no_args_is_help=True)

SOURCE_HELP = ("A .py file, a KernelBench JSONL/folder, a CUDA-Agent-Ops parquet/JSONL, "
               "or builtin:NAME.")


@app.command("list")
def list_tasks(source: str = typer.Argument(..., help=SOURCE_HELP),
               level: int | None = typer.Option(None, help="Only this KernelBench level."),
               as_json: bool = typer.Option(False, "--json", help="Print JSON lines.")) -> None:
    """List the tasks in a file or data set, with the selector that picks each one."""
    try:
        tasks = [t for t in load_tasks(source) if level is None or t.level == level]
    except TaskError as exc:
        errors.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None
    if as_json:
        for task in tasks:
            print_json(task.model_dump(exclude={"code"}))
        return
    table = Table("selector", "name", "origin", "ops")
    for index, task in enumerate(tasks):
        sel = f"{task.level}/{task.problem_id}" if task.problem_id is not None else f"#{index}"
        table.add_row(sel, task.name, task.origin, ", ".join(task.ops))
    console.print(table)
    console.print(f"{len(tasks)} tasks")


@app.command("show")
def show(ref: str = typer.Argument(..., help="Task reference: PATH[::SELECTOR]."),
         inspect: bool = typer.Option(True, help="Run the task to report input/output shapes.")
         ) -> None:
    """Print one task's code and, by running it in a separate process, its shapes."""
    try:
        task = load_task(ref)
        spec = inspect_task(task) if inspect else None
    except TaskError as exc:
        errors.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None
    console.rule(f"{task.label} ({task.origin}, {task.precision.value})")
    console.print(task.code, highlight=False, markup=False)
    if spec:
        console.print(f"inputs:  {', '.join(map(str, spec.inputs))}")
        console.print(f"outputs: {', '.join(map(str, spec.outputs or ())) or 'unknown'}")
        console.print(f"init:    {spec.init_inputs}")


@app.command("check")
def check(refs: list[str] = typer.Argument(..., help="Task references: PATH[::SELECTOR]."),
          inspect: bool = typer.Option(True, help="Also run get_inputs/Model in a process.")
          ) -> None:
    """Validate tasks; exit non-zero naming the problem of each malformed one."""
    bad = 0
    for ref in refs:
        try:
            tasks = [load_task(ref)] if "::" in ref else list(load_tasks(ref))
            for task in tasks:
                if inspect:
                    inspect_task(task)
                console.print(f"[green]ok[/] {task.label}")
        except TaskError as exc:
            bad += 1
            console.print(f"[red]bad[/] {exc}", highlight=False)
    if bad:
        raise typer.Exit(1)
