"""``cuda-agent export``: a result as an installable package; see integrate/export.py."""

from __future__ import annotations

from pathlib import Path

import typer

from cuda_agent.cli.exits import bad_input
from cuda_agent.cli.render import console


def export(
    result_dir: Path = typer.Argument(..., help="An optimize output folder, or its result/ "
                                      "folder (then give --task)."),
    name: str = typer.Option(..., "--name", help="Python package name, e.g. gelu_fast."),
    out: Path = typer.Option(..., "--out", help="Folder to write the package into."),
    task: str | None = typer.Option(None, help="The task's model.py or a task reference "
                                    "(default: OUT/workspace/model.py beside result/)."),
    version: str = typer.Option("0.1.0", help="The package's version."),
    force: bool = typer.Option(False, help="Replace a non-empty --out folder."),
) -> None:
    """Write a pip-installable package (kernels, binding, ModelNew, reference, a test)."""
    from cuda_agent.integrate.export import export as run_export
    from cuda_agent.integrate.load import IntegrateError

    try:
        result = run_export(result_dir, name, out, task=task, version=version, force=force)
    except IntegrateError as exc:
        raise bad_input(exc) from None
    console.print(f"package {result.name} ({result.device} kernels) written to {result.out}")
    for path in result.files:
        console.print(f"  {path}", highlight=False)
    console.print(f"install: pip install --no-build-isolation {result.out}\n"
                  f"test:    pytest {result.out / 'tests'}", highlight=False)
