"""A scripted policy (fixed replies, no model) and a gelu_bias_scale CPU workspace."""

from __future__ import annotations

import itertools
import json
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from cuda_agent.agent.types import (
    Message,
    PolicyError,
    PolicyStep,
    ToolCall,
    ToolSpec,
    Usage,
)
from cuda_agent.tasks import load_task
from cuda_agent.tasks.task import Task
from cuda_agent.workspace import init_workspace

GELU = "builtin:gelu_bias_scale"
Reply = Message | PolicyStep | Callable[[list[Message]], Message | PolicyStep] | Exception

_ids = itertools.count()


def call(name: str, arguments: dict[str, Any] | None = None, raw: str | None = None
         ) -> ToolCall:
    args = {} if arguments is None and raw is None else arguments
    return ToolCall(id=f"call_{next(_ids)}", name=name, arguments=args,
                    raw_arguments=raw if raw is not None else json.dumps(args))


def act(*calls: ToolCall, text: str = "") -> Message:
    return Message(role="assistant", content=text, tool_calls=tuple(calls))


def say(text: str) -> Message:
    return Message(role="assistant", content=text)


class ScriptedPolicy:
    """Answers with ``replies`` in order (then says 'nothing left'); keeps what it saw."""

    def __init__(self, replies: Sequence[Reply], name: str = "scripted",
                 usage: Usage = Usage()):
        self.name = name
        self.replies = list(replies)
        self.usage = usage
        self.seen: list[list[Message]] = []

    def step(self, messages: list[Message], tools: list[ToolSpec]) -> PolicyStep:
        self.seen.append(list(messages))
        reply = self.replies.pop(0) if self.replies else say("nothing left")
        if isinstance(reply, Exception):
            raise reply
        if callable(reply):
            reply = reply(messages)
        if isinstance(reply, PolicyStep):
            return reply
        return PolicyStep(message=reply, usage=self.usage)


def failing(message: str) -> PolicyError:
    return PolicyError(message)


@pytest.fixture
def gelu_task() -> Task:
    return load_task(GELU)


@pytest.fixture(scope="session")
def _pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # init_workspace inspects the task in a subprocess (seconds); copy one made once
    return init_workspace(load_task(GELU), tmp_path_factory.mktemp("pristine") / "ws", "cpu")


@pytest.fixture
def workspace(tmp_path: Path, _pristine: Path) -> Path:
    root = tmp_path / "ws"
    shutil.copytree(_pristine, root, symlinks=True)
    return root
