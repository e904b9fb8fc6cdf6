"""``cuda-agent workspace``: create a workspace and build, verify or profile it."""

from __future__ import annotations

import os
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
from cuda_agent.execution.warm_judge import ENV
from cuda_agent.tasks import TaskError, load_task

app = typer.Typer(help="Stage 2 - workspace: create the agent's workspace; build, verify and "
                  "profile its kernels.", no_args_is_help=True)


@app.command("init")
def init(
    task: str = typer.Argument(..., help="Task reference: PATH[::SELECTOR] or builtin:NAME."),
    directory: Path = typer.Argument(..., help="Folder to create."),
    device: str = typer.Option("cuda", help="cuda (kernels/*.cu) or cpu (kernels/*.cpp).",
                                callback=one_of("cuda", "cpu")),
    arch: str = typer.Option("", help="CUDA target named in SKILL.md, e.g. 90a."),
    force: bool = typer.Option(False, help="Replace a non-empty folder."),
) -> None:
    """Create SKILL.md, model.py, model_new.py, the bindings, kernels/ and utils/."""
    from cuda_agent.judge.cpu_size import workspace_sizing
    from cuda_agent.workspace import WorkspaceError, init_workspace

    try:
        the_task = load_task(task)
        root = init_workspace(the_task, directory, device, arch=arch, force=force,
                              sizing=workspace_sizing(the_task, device))
    except (TaskError, WorkspaceError) as exc:
        raise bad_input(exc) from None
    console.print(f"workspace ready: {root}")
    for name in sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file()
                       and ".cuda-agent" not in p.parts):
        console.print(f"  {name}")


@app.command("build")
def build(directory: Path = typer.Argument(Path("."), help="The workspace."),
          as_json: bool = typer.Option(False, "--json", help="Print the BuildResult as JSON."),
          sets: list[str] = typer.Option([], "--set", help="Build override KEY=VALUE.")) -> None:
    """Incrementally build kernels/ into cuda_extension; errors come with file and line."""
    from cuda_agent.build import BuildConfig, Builder
    from cuda_agent.results import to_dict

    info = _workspace(directory)
    config = overrides.apply(BuildConfig(device=info.device), sets)
    result = Builder(config).build(info.root, publish=True)
    if as_json:
        print_json(to_dict(result))
    else:
        print_build(result)
    if not result.ok:
        raise typer.Exit(REFUSED)


@app.command("verify")
def verify(directory: Path = typer.Argument(Path("."), help="The workspace."),
           as_json: bool = typer.Option(False, "--json", help="Print JSON."),
           sets: list[str] = typer.Option([], "--set", help="Judge override KEY=VALUE.")) -> None:
    """Build, then check ModelNew against the reference on seeded inputs (no timing)."""
    _judge(directory, as_json, sets, time=False, profile=False)


@app.command("profile")
def profile(directory: Path = typer.Argument(Path("."), help="The workspace."),
            as_json: bool = typer.Option(False, "--json", help="Print JSON."),
            sets: list[str] = typer.Option([], "--set", help="Judge override KEY=VALUE.")) -> None:
    """Build, check, and time against eager and torch.compile, with an operator profile."""
    _judge(directory, as_json, sets, time=True, profile=True)


def _workspace(directory: Path):
    from cuda_agent.workspace import WorkspaceError, read_workspace

    try:
        return read_workspace(directory)
    except WorkspaceError as exc:
        raise bad_input(exc) from None


def _judge(directory: Path, as_json: bool, sets: list[str], time: bool, profile: bool) -> None:
    """Through the workspace's warm judge server (started on the first call); with --set, a
    judge of its own in this process, so no caller changes how the shared one measures."""
    from cuda_agent.execution.warm_judge import WarmJudge, WarmJudgeError

    # the episode's shell names its judge and may not read the trusted task itself
    info = _workspace(directory) if sets or not os.environ.get(ENV) else None
    try:
        if sets:
            result = _judge_here(info, sets, time, profile)
        else:
            result = WarmJudge.attach(Path(directory), info.device if info else "").call(
                "profile" if time else "verify")
    except WarmJudgeError as exc:
        raise bad_input(exc) from None
    if as_json:
        print_json(judge_summary(result))
    else:
        print_judge(result)
        if result.build and result.build.ok:
            print_build(result.build)
        if result.profile:
            console.rule("profile (candidate)")
            print(result.profile)
    exit_for_reward(result.reward)


def _judge_here(info, sets: list[str], time: bool, profile: bool):
    from cuda_agent.execution.warm_judge import WarmJudgeError
    from cuda_agent.judge import Candidate, Judge, JudgeConfig
    from cuda_agent.judge.config import in_episode
    from cuda_agent.judge.judge import JudgeError

    config = in_episode(overrides.apply(JudgeConfig(device=info.device, time=time), sets))
    try:
        with Judge(config) as judge:
            return judge.judge(info.task, Candidate("workspace", info.root), profile)
    except JudgeError as exc:
        raise WarmJudgeError(str(exc)) from None
