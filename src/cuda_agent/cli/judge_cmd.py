"""``cuda-agent judge`` and ``cuda-agent demo``."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import typer

from cuda_agent.cli import overrides
from cuda_agent.cli.exits import REFUSED, bad_input, exit_for_reward
from cuda_agent.cli.render import (
    console,
    judge_summary,
    print_build,
    print_json,
    print_judge,
)
from cuda_agent.cli.usage import one_of
from cuda_agent.tasks import Precision, TaskError, load_task

DEVICE_HELP = "cpu, cuda, or auto (CUDA when a GPU is present)."


def make_config(device: str, trials: int | None, no_compile: bool, no_time: bool,
                sets: list[str]):
    from cuda_agent.judge import JudgeConfig

    config = JudgeConfig(device=device)
    if trials is not None:
        config = config.model_copy(update={"trials": trials})
    if no_compile:
        config = config.model_copy(update={"time_compile": False})
    if no_time:
        config = config.model_copy(update={"time": False})
    return overrides.apply(config, sets)


def judge(
    task: str = typer.Argument(..., help="Task reference: PATH[::SELECTOR] or builtin:NAME."),
    candidate: str = typer.Argument(
        ..., help="A workspace folder (model_new.py + kernels/), a .py file defining ModelNew, "
        "or builtin:NAME (a shipped solution)."),
    device: str = typer.Option("auto", help=DEVICE_HELP, callback=one_of("auto", "cpu", "cuda")),
    precision: Precision | None = typer.Option(None, help="Override the declared precision."),
    trials: int | None = typer.Option(None, help="Correctness trials (default 5)."),
    no_compile: bool = typer.Option(False, "--no-compile", help="Skip the torch.compile baseline."),
    no_time: bool = typer.Option(False, "--no-time", help="Check correctness only."),
    shape: str | None = typer.Option(
        None, help="A task declaring INPUT_SHAPES: judge this shape only (default: all)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    sets: list[str] = typer.Option([], "--set", help="Config override KEY=VALUE, repeatable "
                                   "(e.g. --set build.jobs=4 --set time_budget_s=5)."),
) -> None:
    """Stage 3 - judge: build, verify and time a candidate; print the milestone reward.

    Reward: -1 fails to build, crashes or is wrong; 1 correct; 2 more than 5% faster than
    eager PyTorch; 3 more than 5% faster than eager and torch.compile. A task declaring
    INPUT_SHAPES is judged at every shape: correct at all, the lowest shape's reward.
    """
    from cuda_agent.judge import Candidate, CandidateError, Judge
    from cuda_agent.judge.judge import JudgeError

    try:
        config = make_config(device, trials, no_compile, no_time, sets)
        if shape is not None:
            config = config.model_copy(update={"shape": shape})
        the_task = load_task(task, precision=precision)
        judge_ = Judge(config)
        the_candidate = Candidate.from_ref(candidate, judge_.device)
        with console.status(f"judging {the_task.name} on {judge_.device}...",
                            spinner="dots") if not as_json else _null():
            result = judge_.judge(the_task, the_candidate)
    except (TaskError, CandidateError, JudgeError) as exc:
        raise bad_input(exc) from None
    if as_json:
        print_json(judge_summary(result))
    else:
        print_judge(result)
    exit_for_reward(result.reward)


def demo(
    device: str = typer.Option("auto", help=DEVICE_HELP, callback=one_of("auto", "cpu", "cuda")),
    directory: Path | None = typer.Option(None, "--dir", help="Keep the workspace here."),
    example: str = typer.Option("gelu_bias_scale", help="Built-in example task."),
) -> None:
    """Offline walk-through on a built-in example: workspace, kernel, build, judge."""
    from cuda_agent.build import Builder
    from cuda_agent.judge import Candidate, Judge, JudgeConfig
    from cuda_agent.judge.cpu_size import workspace_sizing
    from cuda_agent.judge.judge import JudgeError, resolve_device
    from cuda_agent.workspace import init_workspace

    try:
        dev = resolve_device(device)
        task = load_task(f"builtin:{example}")
    except (JudgeError, TaskError) as exc:
        raise bad_input(exc) from None
    root = directory or Path(tempfile.mkdtemp(prefix="cuda-agent-demo-")) / "workspace"
    console.rule(f"1. workspace for builtin:{example} ({dev})")
    init_workspace(task, root, dev, force=directory is not None,
                   sizing=workspace_sizing(task, dev))
    console.print(f"created {root}: SKILL.md, model.py, model_new.py, kernels/, utils/")
    console.rule("2. write the kernel (the shipped solution stands in for the agent)")
    solution = Candidate.from_ref(f"builtin:{example}", dev).path
    for src in sorted(solution.rglob("*")):
        if src.is_file():
            dst = root / src.relative_to(solution)
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)
            console.print(f"  wrote {dst.relative_to(root)}")
    console.rule("3. build (first build also compiles the fixed binding layer once)")
    config = JudgeConfig(device=dev)
    with console.status("building..."):
        build = Builder(config.build.model_copy(update={"device": dev})).build(root, publish=True)
    print_build(build)
    if not build.ok:
        raise typer.Exit(REFUSED)
    console.rule("4. judge: correctness on seeded inputs, timing against eager and compile")
    with console.status("judging..."):
        result = Judge(config).judge(task, Candidate.from_ref(root, dev))
    print_judge(result)
    console.print(f"workspace kept at {root}")
    exit_for_reward(result.reward)


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
