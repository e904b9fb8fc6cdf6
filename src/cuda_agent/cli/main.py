"""The ``cuda-agent`` command: ``cuda-agent --help`` lists the stages."""

from __future__ import annotations

import typer

from cuda_agent.cli import (
    baselines_cmd,
    eval_cmd,
    export_cmd,
    extract_cmd,
    judge_cmd,
    mcp_cmd,
    optimize_cmd,
    rollout_cmd,
    serve_cmd,
    synth_cmd,
    tasks_cmd,
    train_cmd,
    trajectories_cmd,
    usage,
    workspace_cmd,
)

app = typer.Typer(
    name="cuda-agent",
    help="Turn PyTorch programs into faster, verified custom CUDA (or C++) kernels.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.add_typer(tasks_cmd.app, name="tasks")
app.add_typer(workspace_cmd.app, name="workspace")
app.add_typer(synth_cmd.app, name="synth")
app.add_typer(trajectories_cmd.app, name="trajectories")
app.add_typer(train_cmd.app, name="train")
app.add_typer(eval_cmd.app, name="eval")
app.command("judge")(judge_cmd.judge)
app.command("demo")(judge_cmd.demo)
app.command("serve")(serve_cmd.serve)
app.command("mcp")(mcp_cmd.mcp)
app.command("optimize")(optimize_cmd.optimize)
app.command("rollout")(rollout_cmd.rollout)
app.command("export")(export_cmd.export)
app.command("extract")(extract_cmd.extract)
app.command("baselines")(baselines_cmd.baselines)


def main() -> None:
    usage.run(app)


if __name__ == "__main__":
    main()
