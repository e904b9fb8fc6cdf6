"""Shared fixtures: a tiny local tokenizer, a real short episode, hand-made trajectories."""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cuda_agent.agent.loop import AgentConfig, run_episode
from cuda_agent.agent.policies import make_policy
from cuda_agent.agent.trajectory import Recorder
from cuda_agent.agent.types import EpisodeResult, Message, PolicyStep, ToolCall, ToolResult
from cuda_agent.tasks import load_task
from cuda_agent.workspace import init_workspace
from tests.agent.test_policies import CHAT_TEMPLATE, build_tiny_model

GELU = "builtin:gelu_bias_scale"
SHORT_REPLAY = [
    {"role": "assistant", "content": "I will read the reference first.",
     "tool_calls": [{"id": "c1", "name": "read_file", "arguments": {"path": "model.py"}}]},
    {"role": "assistant", "content": "Listing the kernels.",
     "tool_calls": [{"id": "c2", "name": "glob", "arguments": {"pattern": "kernels/*"}}]},
]


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Byte-level BPE tokenizer trained locally (no chat template: the plain template)."""
    from transformers import AutoTokenizer

    folder = build_tiny_model(tmp_path_factory.mktemp("tiny-tok"))
    return AutoTokenizer.from_pretrained(folder)


@pytest.fixture(scope="session")
def chat_tokenizer(tiny_tokenizer: Any) -> Any:
    """The same tokenizer with a small chat template that renders tools."""
    import copy

    tokenizer = copy.deepcopy(tiny_tokenizer)
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


@pytest.fixture(scope="session")
def pristine_workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # init_workspace inspects the task in a subprocess (seconds); copy one made once
    return init_workspace(load_task(GELU), tmp_path_factory.mktemp("pristine") / "ws", "cpu")


@pytest.fixture(scope="session")
def short_replay(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("replay") / "short.json"
    path.write_text(json.dumps(SHORT_REPLAY))
    return path


@pytest.fixture(scope="session")
def episode_trajectory(tmp_path_factory: pytest.TempPathFactory, pristine_workspace: Path,
                       short_replay: Path) -> Path:
    """A real episode (loop, tools, workspace) of a short replay, without final judgement."""
    folder = tmp_path_factory.mktemp("episode")
    root = folder / "ws"
    shutil.copytree(pristine_workspace, root, symlinks=True)
    trajectory = folder / "trajectory.jsonl"
    run_episode(load_task(GELU), root, make_policy(f"replay:{short_replay}"),
                AgentConfig(final_judge=False), trajectory)
    return trajectory


def call(name: str, arguments: dict[str, Any] | None, call_id: str = "c") -> ToolCall:
    raw = json.dumps(arguments) if arguments is not None else "{not json"
    return ToolCall(call_id, name, arguments, raw)


@dataclasses.dataclass
class Turn:
    """One assistant message and the tool results its calls get (ok, output)."""

    message: Message
    results: list[tuple[bool, str]] = dataclasses.field(default_factory=list)


TrajectoryMaker = Callable[..., Path]


@pytest.fixture
def make_trajectory(tmp_path: Path) -> TrajectoryMaker:
    """Write a trajectory by hand: ``make(turns, reward=3, stop="done", end=True)``."""
    counter = iter(range(10_000))

    def make(turns: list[Turn], reward: int | None = 3, stop: str = "done", end: bool = True,
             name: str | None = None) -> Path:
        path = tmp_path / (name or f"t{next(counter)}.jsonl")
        with Recorder(path) as rec:
            rec.episode_start("gelu_bias_scale", "hand", {})
            rec.message(Message("system", "Write fast kernels."))
            rec.message(Message("user", "Make it faster."))
            for i, turn in enumerate(turns, start=1):
                rec.message(turn.message)
                rec.step(i, PolicyStep(turn.message), 0.1)
                for c, (ok, output) in zip(turn.message.tool_calls, turn.results, strict=False):
                    rec.message(Message("tool", output, tool_call_id=c.id, name=c.name))
                    rec.tool_result(i, c.id, c.name, ToolResult(ok, output))
            if end:
                rec.episode_end(EpisodeResult("gelu_bias_scale", "hand", stop, len(turns), 0, 0,
                                              1.0, reward, None))
        return path

    return make
