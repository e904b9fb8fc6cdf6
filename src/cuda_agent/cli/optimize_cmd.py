"""``cuda-agent optimize``: the main job (agent + judge + result folder); see agent/optimize.py."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import typer

from cuda_agent.cli import agent_options as opts
from cuda_agent.cli.exits import bad_input, exit_for_reward
from cuda_agent.cli.render import console


def optimize(
    task: str = typer.Argument("builtin:gelu_bias_scale",
                               help="Task reference: PATH[::SELECTOR] or builtin:NAME."),
    model: str = typer.Option("replay:builtin", help=opts.MODEL_HELP),
    base_url: str | None = opts.BASE_URL,
    api_key: str | None = opts.API_KEY,
    temperature: float | None = opts.TEMPERATURE,
    device: str = opts.DEVICE,
    out: Path | None = typer.Option(None, help="Result folder (default "
                                    "cuda-agent-runs/TASK-TIME)."),
    max_turns: int = opts.MAX_TURNS,
    max_tokens: int = opts.MAX_TOKENS,
    sets: list[str] = opts.SETS,
    tool_sets: list[str] = opts.TOOL_SETS,
) -> None:
    """Optimise TASK with an agent: workspace, episode, final judgement, report."""
    from cuda_agent.agent.optimize import OptimizeError
    from cuda_agent.agent.optimize import optimize as run_job
    from cuda_agent.judge.judge import resolve_device
    from cuda_agent.tasks import load_task

    with opts.bad_input_exits():
        dev = resolve_device(device)
        the_task = load_task(task)
        policy = opts.make_cli_policy(opts.policy_spec(model, the_task, dev), base_url,
                                      api_key, temperature)
        config = opts.agent_config(dev, max_turns, max_tokens, sets, tool_sets)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    folder = out or Path("cuda-agent-runs") / f"{the_task.name}-{stamp}"
    console.rule(f"optimize {the_task.name} on {dev} with {policy.name}")
    try:
        job = run_job(the_task, policy, dev, folder, config, on_event=_Progress())
    except OptimizeError as exc:
        raise bad_input(exc) from None
    episode = job.episode
    console.rule("result")
    console.print(job.report.read_text(), markup=False, highlight=False)
    console.print(f"result folder: {job.out}")
    exit_for_reward(episode.reward)


class _Progress:
    """Live progress: one line per turn, tool call and judgement."""

    def __init__(self) -> None:
        self.text_calls_said = False

    def __call__(self, kind: str, payload: dict[str, Any]) -> None:
        if kind == "text_calls" and payload["form"] != "unreadable" \
                and not self.text_calls_said:
            self.text_calls_said = True
            console.print(f"  [yellow]note:[/] the server returns tool calls as text; reading "
                          f"them ({payload['form']} form). A tool-call parser on the server "
                          "(vLLM: --enable-auto-tool-choice --tool-call-parser NAME) returns "
                          "them as calls", highlight=False)
        elif kind == "tool_result":
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
