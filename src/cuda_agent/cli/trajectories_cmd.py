"""``cuda-agent trajectories``: read the agent's recorded episodes (JSONL)."""

from __future__ import annotations

from pathlib import Path

import typer

from cuda_agent.cli.exits import bad_input
from cuda_agent.cli.render import console, errors, print_json

app = typer.Typer(help="Stage 4 - agent: show recorded agent trajectories.",
                  no_args_is_help=True)


@app.command("show")
def show(path: Path = typer.Argument(..., help="A trajectory file (.jsonl)."),
         full: bool = typer.Option(False, help="Do not shorten long messages."),
         as_json: bool = typer.Option(False, "--json", help="Print the records as JSON.")
         ) -> None:
    """Print an episode: messages, tool calls and results, judgements, and how it ended."""
    from cuda_agent.agent.trajectory import TrajectoryError, read_trajectory
    from cuda_agent.agent.trajectory_view import render

    try:
        trajectory = read_trajectory(path)
    except (OSError, TrajectoryError) as exc:
        raise bad_input(exc) from None
    if as_json:
        print_json(list(trajectory.records))
    else:
        console.print(render(trajectory.records, full=full), markup=False, highlight=False,
                      soft_wrap=True)
    if trajectory.truncated_line is not None:
        errors.print(f"[yellow]warning:[/] the last line was cut off (the writer stopped "
                     f"mid-record); {len(trajectory.truncated_line)} characters ignored",
                     highlight=False)
    if not trajectory.complete:
        errors.print("[yellow]warning:[/] no episode_end record: the episode did not finish",
                     highlight=False)
