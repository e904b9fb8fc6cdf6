"""``cuda-agent extract``: turn a sub-module of your model into a task, or rank sub-modules.

    cuda-agent extract mypkg.model:build_model --child model.layers.0.mlp \\
        --inputs 'long[2,16]:0..1000' --inputs 'long[2,128]:0..1000' --out extracted/mlp
    cuda-agent extract mypkg.model:build_model --inputs 'long[2,16]:0..1000' --rank
    cuda-agent extract mypkg.blocks:Block --init-args '[64]' --inputs 'float32[2,16,64]'

Run it from your project's root: the current folder is importable, like ``python -m``.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from cuda_agent.cli.exits import REFUSED, bad_input
from cuda_agent.cli.render import console, print_json
from cuda_agent.results import to_dict

INPUTS_HELP = ("Sample inputs of the WHOLE model, one forward per option: tensor specs "
               "'DTYPE[D0,D1,...][:LOW..HIGH]' separated by ',' or ';' (e.g. "
               "'long[2,16]:0..1000'), or 'pkg.mod:fn' returning a tensor, a tuple of args or "
               "a dict of kwargs. Several options record several input shapes.")


def _init_args(text: str | None) -> Any:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise bad_input(f"--init-args: invalid JSON ({exc.msg}); give a list of positional "
                        "or an object of keyword arguments, e.g. '[64]' or "
                        '\'{"dim": 64}\'') from None
    if not isinstance(value, (list, dict)):
        raise bad_input("--init-args must be a JSON list (positional) or object (keyword "
                        "arguments)")
    return value


def print_ranking(ranking: Any) -> None:
    table = Table(title=f"forward time by module (total {ranking.total_ms:.3g} ms, "
                        f"mean of {ranking.repeats})")
    table.add_column("module (kind)", overflow="fold", ratio=1)
    for column in ("count", "calls", "inclusive", "%", "self", "self %"):
        table.add_column(column, justify="right", no_wrap=True)
    for m in ranking.modules:
        table.add_row(f"{m.name} [dim]({m.kind})[/]", str(m.count), str(m.calls),
                      f"{m.inclusive_ms:.3g} ms",
                      f"{100 * m.inclusive_share:.1f}", f"{m.self_ms:.3g} ms",
                      f"{100 * m.self_share:.1f}")
    console.print(table)


def print_result(result: Any) -> None:
    table = Table("shape", "input shapes", "exact", "max |diff|", "get_inputs", "error",
                  title=f"{result.class_path} vs {result.task_path}")
    for check in result.checks:
        table.add_row(check.name, " ".join(str(list(s)) for s in check.shapes),
                      "yes" if check.exact else "no", f"{check.max_abs_diff:.3g}",
                      "ok" if check.inputs_match else "differs", check.error or "")
    console.print(table)
    if len(result.matched) > 1:
        console.print(f"{len(result.matched)} modules match {result.child!r}: "
                      f"{', '.join(result.matched[:6])}{' ...' if len(result.matched) > 6 else ''}")
    if result.fallback:
        console.print(f"[yellow]fallback:[/] {result.fallback}; model.py loads the whole "
                      f"module from {Path(result.out) / 'module.pt'}", highlight=False)
    for note in result.notes:
        console.print(f"note: {note}", highlight=False)
    files = ", ".join(p.name for p in sorted(Path(result.out).iterdir()))
    verdict = "[green]reproduces the module[/]" if result.ok else "[red]does NOT reproduce[/]"
    console.print(f"wrote {result.out}/ ({files}): the task {verdict}")


def extract(
    target: str = typer.Argument(..., help="MODULE:NAME of a factory function, an nn.Module "
                                 "class (see --init-args) or a module instance."),
    inputs: list[str] = typer.Option([], "--inputs", "-i", help=INPUTS_HELP),
    child: str = typer.Option("", "--child", "-c", help="Dotted name of the sub-module to "
                              "extract, '*' matching one segment (model.layers.*.mlp); "
                              "default: the whole model."),
    out: Path | None = typer.Option(None, "--out", "-o", help="Output folder "
                                    "(default: extracted/<child>)."),
    init_args: str | None = typer.Option(None, "--init-args", help="JSON list or object: "
                                         "the arguments of the factory or class."),
    rank: bool = typer.Option(False, "--rank", help="Rank the model's sub-modules by their "
                              "share of forward time; without --child, extract nothing."),
    top: int = typer.Option(15, help="Rows of the --rank table."),
    repeats: int = typer.Option(3, help="Timed passes for --rank."),
    seed: int = typer.Option(0, help="Seed of the random sample inputs."),
    device: str | None = typer.Option(None, help="Move the model and inputs here (cuda)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
    force: bool = typer.Option(False, help="Replace a non-empty --out folder."),
) -> None:
    """Write a KernelBench-format task (model.py, weights.pt, extract.json) reproducing one
    sub-module of your model, checked against it; or rank sub-modules by forward time."""
    from cuda_agent.integrate.capture import forget_constructors
    from cuda_agent.integrate.extract import build, claim_folder, extract_module
    from cuda_agent.integrate.profile import rank as rank_modules
    from cuda_agent.integrate.specs import ExtractError, to_sample

    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    if not inputs:
        raise bad_input("give sample inputs with --inputs, e.g. --inputs 'long[2,16]:0..1000'")
    try:
        samples = [to_sample(spec, seed + i) for i, spec in enumerate(inputs)]
        if out is not None and (child or not rank):  # before the model is built
            claim_folder(out, force)
        model = build(target, _init_args(init_args))
    except ExtractError as exc:
        raise bad_input(str(exc)) from None
    if device is not None:
        model.to(device)
    try:
        if rank:
            ranking = rank_modules(model, samples, repeats=repeats, top=top)
            print_json(to_dict(ranking)) if as_json else print_ranking(ranking)
            if not child:
                return
        folder = out or Path("extracted") / (re.sub(r"\W+", "_", child.replace("*", "x"))
                                             or type(model).__name__)
        result = extract_module(model, samples, child, folder, target, force)
    except ExtractError as exc:
        raise bad_input(str(exc)) from None
    finally:
        forget_constructors(model)
    if as_json:
        print_json({**to_dict(result), "ok": result.ok})
    else:
        print_result(result)
    if not result.ok:
        raise typer.Exit(REFUSED)
