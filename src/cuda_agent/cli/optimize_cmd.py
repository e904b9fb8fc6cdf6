"""``cuda-agent optimize``: the main job (agent + judge + result folder); see agent/optimize.py."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import typer

from cuda_agent.cli import overrides
from cuda_agent.cli.render import console, errors

DEVICE_HELP = "cpu, cuda, or auto (CUDA when a GPU is present)."


def optimize(
    task: str = typer.Argument("builtin:gelu_bias_scale",
                               help="Task reference: PATH[::SELECTOR] or builtin:NAME."),
    model: str = typer.Option(
        "replay:builtin", help="Policy: openai:NAME (with --base-url), hf:PATH, "
        "replay:FILE, or replay:builtin (the shipped replay of the built-in example)."),
    base_url: str | None = typer.Option(None, help="OpenAI-compatible server, e.g. "
                                        "http://localhost:8000/v1."),
    api_key: str | None = typer.Option(None, envvar="CUDA_AGENT_API_KEY",
                                       help="Key for the server (or env CUDA_AGENT_API_KEY)."),
    temperature: float | None = typer.Option(None, help="Sampling temperature."),
    device: str = typer.Option("auto", help=DEVICE_HELP),
    out: Path | None = typer.Option(None, help="Result folder (default "
                                    "cuda-agent-runs/TASK-TIME)."),
    max_turns: int = typer.Option(200, help="Policy steps at most."),
    max_tokens: int = typer.Option(128_000, help="Context budget of one step, in tokens."),
    sets: list[str] = typer.Option([], "--set", help="Final-judgement override KEY=VALUE "
                                   "(same keys as `cuda-agent judge --set`)."),
) -> None:
    """Optimise TASK with an agent: workspace, episode, final judgement, report."""
    from cuda_agent.agent.loop import AgentConfig
    from cuda_agent.agent.optimize import BUILTIN_REPLAY, OptimizeError, builtin_replay_path
    from cuda_agent.agent.optimize import optimize as run_job
    from cuda_agent.agent.policies import make_policy
    from cuda_agent.agent.types import PolicyError
    from cuda_agent.judge import JudgeConfig
    from cuda_agent.judge.judge import JudgeError, resolve_device
    from cuda_agent.tasks import TaskError, load_task

    try:
        dev = resolve_device(device)
        the_task = load_task(task)
        spec = model
        if model == BUILTIN_REPLAY:
            spec = f"replay:{builtin_replay_path(the_task, dev)}"
        policy = make_policy(spec, base_url=base_url, api_key=api_key,
                             temperature=temperature) if spec.startswith("openai:") else \
            make_policy(spec, temperature=temperature) if spec.startswith("hf:") else \
            make_policy(spec)
        judge_sets = overrides.apply(JudgeConfig(device=dev), sets)
        config = AgentConfig(max_turns=max_turns, max_tokens=max_tokens,
                             judge=judge_sets.model_dump(exclude={"device"}, mode="json"))
    except (JudgeError, TaskError, OptimizeError, PolicyError, ValueError) as exc:
        errors.print(f"[red]error:[/] {exc}", highlight=False)
        raise typer.Exit(2) from None
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    folder = out or Path("cuda-agent-runs") / f"{the_task.name}-{stamp}"
    console.rule(f"optimize {the_task.name} on {dev} with {policy.name}")
    try:
        job = run_job(the_task, policy, dev, folder, config, on_event=_Progress())
    except OptimizeError as exc:
        errors.print(f"[red]error:[/] {exc}", highlight=False)
        raise typer.Exit(2) from None
    episode = job.episode
    console.rule("result")
    console.print(job.report.read_text(), markup=False, highlight=False)
    console.print(f"result folder: {job.out}")
    if episode.reward is None or episode.reward < 1:
        raise typer.Exit(1)


class _Progress:
    """Live progress: one line per turn, tool call and judgement."""

    def __call__(self, kind: str, payload: dict[str, Any]) -> None:
        if kind == "tool_result":
            result = payload["result"]
            mark = "[green]ok[/]" if result.ok else "[red]failed[/]"
            first = (result.output.strip().splitlines() or [""])[0][:90]
            console.print(f"  turn {payload['turn']:>3}  {payload['name']:<10} {mark}  "
                          f"{result.seconds:5.1f} s  [dim]{first}[/]", highlight=False)
        elif kind == "step":
            text = payload["message"].content.strip().splitlines()
            if text:
                console.print(f"[bold]turn {payload['turn']:>3}[/]  {text[0][:100]}",
                              highlight=False)
        elif kind == "judge" and payload.get("source") == "final":
            data = payload.get("result") or {}
            console.print(f"  final judgement: reward {data.get('reward')}, "
                          f"speed-up vs eager {_x(data.get('speedup_vs_eager'))}, "
                          f"vs compile {_x(data.get('speedup_vs_compile'))}", highlight=False)


def _x(value: Any) -> str:
    return f"{value:.2f}x" if isinstance(value, (int, float)) else "-"
