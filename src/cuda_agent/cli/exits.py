"""The exit status every ``cuda-agent`` command shares (README, "Exit status"):

- 0: the command did its job, and the candidate it judged passed (reward 1 or more);
- 1: the judge refused the candidate (reward -1), or the job itself failed;
- 2: bad input: a task, candidate, file, option or setting the command cannot use.

Each command ends through these helpers, so the convention lives in one place.
"""

from __future__ import annotations

import typer

from cuda_agent.cli.render import errors

DONE = 0
REFUSED = 1
BAD_INPUT = 2


def bad_input(message: object) -> typer.Exit:
    """Print ``error: MESSAGE`` on standard error; return the exit (status 2) to raise."""
    errors.print(f"[red]error:[/] {message}", highlight=False)
    return typer.Exit(BAD_INPUT)


def failed(message: object) -> typer.Exit:
    """Print ``error: MESSAGE`` on standard error; return the exit (status 1) to raise: the
    input was usable but the job did not get done."""
    errors.print(f"[red]error:[/] {message}", highlight=False)
    return typer.Exit(REFUSED)


def passed(reward: int | None) -> bool:
    """Whether the judge passed a candidate with this reward (``None``: never judged)."""
    return reward is not None and reward >= 1


def exit_for_reward(reward: int | None) -> None:
    """Return if the judge passed the candidate; otherwise exit with status 1."""
    if not passed(reward):
        raise typer.Exit(REFUSED)
