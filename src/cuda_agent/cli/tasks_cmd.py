"""``cuda-agent tasks``: list, show and check tasks in any supported format."""

from __future__ import annotations

from collections.abc import Iterator

import typer
from rich.table import Table

from cuda_agent.cli.exits import REFUSED, bad_input
from cuda_agent.cli.render import console, print_json
from cuda_agent.tasks import Task, TaskError, load_task, load_tasks
from cuda_agent.tasks.inspect import inspect_task
from cuda_agent.tasks.loaders import each_task

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
        raise bad_input(exc) from None
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
        raise bad_input(exc) from None
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
    """Validate every task of every reference, one line each; exit 1 naming the problem of
    each malformed one."""
    checked = bad = 0
    for ref in refs:
        for item in _each(ref):
            checked += 1
            try:
                if isinstance(item, TaskError):
                    raise item
                if inspect:
                    inspect_task(item)
                console.print(f"[green]ok[/] {item.label}", highlight=False)
            except TaskError as exc:
                bad += 1
                console.print(f"[red]bad[/] {exc}", highlight=False)
    if checked > 1 or bad:
        console.print(f"{checked - bad} of {checked} tasks ok", highlight=False)
    if bad:
        raise typer.Exit(REFUSED)


def _each(ref: str) -> Iterator[Task | TaskError]:
    """The tasks ``ref`` names (one, with a selector), each one or the error in its place."""
    if "::" in ref:
        try:
            yield load_task(ref)
        except TaskError as exc:
            yield exc
        return
    found = False
    for item in each_task(ref):
        found = True
        yield item
    if not found:
        yield TaskError(f"{ref}: holds no tasks")
