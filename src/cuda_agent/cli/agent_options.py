"""What `optimize` and `rollout` share: the policy a --model names, and the agent's config."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import typer

from cuda_agent.cli import overrides
from cuda_agent.cli.exits import bad_input
from cuda_agent.cli.usage import one_of


@contextlib.contextmanager
def bad_input_exits() -> Iterator[None]:
    """Turn a bad task, device, policy or setting into a one-line error and exit status 2."""
    from cuda_agent.agent.optimize import OptimizeError
    from cuda_agent.agent.types import PolicyError
    from cuda_agent.judge.judge import JudgeError
    from cuda_agent.tasks import TaskError

    try:
        yield
    except (JudgeError, TaskError, OptimizeError, PolicyError, ValueError) as exc:
        raise bad_input(exc) from None


def policy_spec(model: str, task: Any, device: str) -> str:
    """``model``, with ``replay:builtin`` resolved to the shipped replay for ``task``."""
    from cuda_agent.agent.optimize import BUILTIN_REPLAY, builtin_replay_path

    return f"replay:{builtin_replay_path(task, device)}" if model == BUILTIN_REPLAY else model


def make_cli_policy(spec: str, base_url: str | None, api_key: str | None,
                    temperature: float | None) -> Any:
    """The policy of ``spec`` with the command-line options that apply to its kind."""
    from cuda_agent.agent.policies import make_policy

    if spec.startswith("openai:"):
        return make_policy(spec, base_url=base_url, api_key=api_key, temperature=temperature)
    if spec.startswith("hf:"):
        return make_policy(spec, temperature=temperature)
    return make_policy(spec)


def agent_config(device: str, max_turns: int, max_tokens: int, sets: list[str],
                 tool_sets: list[str] = ()) -> Any:
    """AgentConfig with the final judgement's ``--set`` overrides and the episode's verify
    and profile tools' ``--tool-set`` overrides (device from the task's workspace)."""
    from cuda_agent.agent.loop import AgentConfig
    from cuda_agent.agent.tools import ToolsConfig
    from cuda_agent.judge import JudgeConfig

    judge = overrides.apply(JudgeConfig(device=device), sets)
    tools = overrides.apply(JudgeConfig(device=device), list(tool_sets))
    changed = tools.model_dump(exclude={"device"}, mode="json", exclude_unset=True)
    return AgentConfig(max_turns=max_turns, max_tokens=max_tokens,
                       tools=ToolsConfig(judge=changed),
                       judge=judge.model_dump(exclude={"device"}, mode="json"))


# the options both commands take, declared once
MODEL_HELP = ("Policy: openai:NAME (with --base-url), hf:PATH, replay:FILE, or replay:builtin "
              "(the shipped replay of the built-in example).")
DEVICE = typer.Option("auto", help="cpu, cuda, or auto (CUDA when a GPU is present).",
                      callback=one_of("auto", "cpu", "cuda"))
BASE_URL = typer.Option(None, help="OpenAI-compatible server, e.g. http://localhost:8000/v1.")
API_KEY = typer.Option(None, envvar="CUDA_AGENT_API_KEY",
                       help="Key for the server (or env CUDA_AGENT_API_KEY).")
TEMPERATURE = typer.Option(None, help="Sampling temperature.")
MAX_TURNS = typer.Option(200, help="Policy steps per episode at most.")
MAX_TOKENS = typer.Option(128_000, help="Context budget of one step, in tokens.")
SETS = typer.Option([], "--set", help="Final-judgement override KEY=VALUE (same keys as "
                    "`cuda-agent judge --set`).")
TOOL_SETS = typer.Option([], "--tool-set", help="Override KEY=VALUE of the judgements the "
                         "agent's verify and profile tools make, e.g. --tool-set "
                         "time_compile=false.")
