"""``cuda-agent rollout``: collect agent episodes for training; see train/rollout.py."""

from __future__ import annotations

from pathlib import Path

import typer

from cuda_agent.cli import agent_options as opts
from cuda_agent.cli.exits import REFUSED
from cuda_agent.cli.render import console, errors


def rollout(
    tasks: str = typer.Argument(..., help="Task set: PATH[::SELECTOR] (file or folder) or "
                                "builtin:NAME."),
    model: str = typer.Option(..., help=opts.MODEL_HELP),
    out: Path = typer.Option(..., help="Output folder (reused to resume)."),
    episodes_per_task: int = typer.Option(1, min=1, help="Episodes per task."),
    parallel: int = typer.Option(1, min=1, help="Episodes run at once."),
    device: str = opts.DEVICE,
    base_url: str | None = opts.BASE_URL,
    api_key: str | None = opts.API_KEY,
    temperature: float | None = opts.TEMPERATURE,
    max_turns: int = opts.MAX_TURNS,
    max_tokens: int = opts.MAX_TOKENS,
    sets: list[str] = opts.SETS,
) -> None:
    """Collect EPISODES-PER-TASK episodes per task of TASKS into OUT (resumable)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from cuda_agent.cli.agent_options import make_cli_policy
    from cuda_agent.judge.judge import resolve_device
    from cuda_agent.tasks import TaskError, load_task, load_tasks
    from cuda_agent.train.rollout import RolloutConfig, collect

    with opts.bad_input_exits():
        dev = resolve_device(device)
        task_list = [load_task(tasks)] if "::" in tasks else list(load_tasks(tasks))
        if not task_list:
            raise TaskError(f"{tasks}: no tasks")
        specs = {t.name: opts.policy_spec(model, t, dev) for t in task_list}
        shared = None if model.startswith("replay:") else make_cli_policy(
            model, base_url, api_key, temperature)
        for spec in set(specs.values()) if shared is None else ():
            make_cli_policy(spec, None, None, None)  # fail early on a bad replay file
        agent = opts.agent_config(dev, max_turns, max_tokens, sets)
        config = RolloutConfig(episodes_per_task=episodes_per_task, parallel=parallel,
                               device=dev, agent=agent)

    def factory(task):
        # A replay keeps its position, so each episode gets its own; a model is shared.
        return shared if shared is not None else make_cli_policy(specs[task.name], None, None,
                                                                  None)

    with Progress("[progress.description]{task.description}", BarColumn(),
                  MofNCompleteColumn(), TimeElapsedColumn(), console=console) as bar:
        job = bar.add_task("episodes", total=None)

        def started(todo: int, skipped: int) -> None:
            bar.update(job, total=todo)
            if skipped:
                console.print(f"resuming: {skipped} episode(s) already in the manifest")

        def finished(record) -> None:
            bar.advance(job)
            if record is not None:
                console.print(f"  {record.task}-{record.k}: reward {record.reward}, "
                              f"{record.stop_reason}", highlight=False)

        summary = collect(task_list, factory, out, config, started, finished)
    rewards = [r.reward for r in summary.finished]
    solved = sum(1 for r in rewards if r is not None and r >= 1)
    console.print(f"{len(summary.finished)} episode(s) run, {summary.skipped} skipped, "
                  f"{solved} with reward >= 1; manifest: {out / 'rollouts.jsonl'}")
    for name, error in summary.failed.items():
        errors.print(f"[red]failed:[/] {name}: {error}", highlight=False)
    if summary.failed:
        raise typer.Exit(REFUSED)
