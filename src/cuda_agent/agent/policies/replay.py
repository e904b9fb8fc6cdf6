"""A policy that replays recorded assistant messages: for tests, demos and re-judging.

    cuda-agent ... --model replay:runs/episode-0001.jsonl

The file is either a trajectory (JSONL; its ``{"type": "message", "message": {...}}`` records
with role 'assistant' are replayed in order, every other record is ignored) or a JSON list of
message dicts (those with role 'assistant', or with no role, are replayed). When the messages
run out, the policy calls the ``submit`` tool (call id ``replay-end``) so the loop ends cleanly.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from cuda_agent.agent.types import (
    Message,
    PolicyError,
    PolicyStep,
    ToolCall,
    ToolSpec,
    message_from_dict,
)

END_CALL_ID = "replay-end"
SUBMIT_TOOL = "submit"


class ReplayConfig(BaseModel):
    """Which recording to replay."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str = Field(min_length=1)
    """A trajectory JSONL, or a JSON list of assistant message dicts."""


def load_assistant_messages(path: str | Path) -> list[Message]:
    """The assistant messages of a recording, in order; PolicyError when the file is missing,
    unreadable, not JSON/JSONL, or holds no assistant message."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise PolicyError(f"replay: file not found: {path}") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise PolicyError(f"replay: cannot read {path}: {exc}") from exc
    stripped = text.lstrip()
    if stripped.startswith("["):
        records = _message_list(path, stripped)
    else:
        records = _trajectory_messages(path, text)
    messages = []
    for where, record in records:
        try:
            message = message_from_dict(record)
        except ValueError as exc:
            raise PolicyError(f"replay: {path}{where}: {exc}") from exc
        if message.role == "assistant":
            messages.append(message)
    if not messages:
        raise PolicyError(f"replay: no assistant messages in {path} (expected a trajectory "
                          "JSONL with 'message' records, or a JSON list of messages)")
    return messages


def _message_list(path: Path, text: str) -> list[tuple[str, Any]]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PolicyError(f"replay: {path} is not valid JSON: {exc}") from exc
    out = []
    for index, item in enumerate(data):
        if isinstance(item, dict) and "role" not in item:
            item = {**item, "role": "assistant"}
        out.append((f" item {index}", item))
    return out


def _trajectory_messages(path: Path, text: str) -> list[tuple[str, Any]]:
    out = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise PolicyError(f"replay: {path} line {number} is not JSON ({exc}); expected a "
                              "trajectory JSONL or a JSON list of messages") from exc
        if isinstance(record, dict) and record.get("type") == "message":
            out.append((f" line {number}", record.get("message")))
    return out


class ReplayPolicy:
    """Answers each step with the next recorded assistant message, then with ``submit``."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.name = f"replay:{self.path}"
        self.messages = load_assistant_messages(self.path)
        self._next = 0

    @property
    def exhausted(self) -> bool:
        return self._next >= len(self.messages)

    def step(self, messages: list[Message], tools: list[ToolSpec]) -> PolicyStep:
        if self.exhausted:
            end = ToolCall(id=END_CALL_ID, name=SUBMIT_TOOL, arguments={})
            return PolicyStep(message=Message(role="assistant",
                                              content="(replay finished)",
                                              tool_calls=(end,)))
        message = self.messages[self._next]
        self._next += 1
        return PolicyStep(message=message)
