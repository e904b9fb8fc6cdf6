"""The agent's data: chat messages, tool calls and results, policy steps, episode results.

Every part of the agent speaks these types: the loop (``loop.py``), the tools
(``tools.py``), the policies (``policies/``), the trajectory recorder (``trajectory.py``)
and the MCP server. Messages follow the chat-completions shape (role, content, tool calls
with JSON arguments), so any OpenAI-compatible server can be a policy unchanged.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, Protocol

Role = Literal["system", "user", "assistant", "tool"]
StopReason = Literal["done", "turn_limit", "token_limit", "error"]


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """One call the model asked for; ``arguments`` is the decoded JSON object, or None when
    the model's arguments were not valid JSON (``raw_arguments`` keeps what it sent)."""

    id: str
    name: str
    arguments: dict[str, Any] | None
    raw_arguments: str = ""


@dataclasses.dataclass(frozen=True)
class Message:
    """One chat message. ``tool_call_id`` is set on role 'tool' (the call it answers)."""

    role: Role
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None


@dataclasses.dataclass(frozen=True)
class ToolSpec:
    """A tool as the model sees it: name, description, JSON-schema of its arguments."""

    name: str
    description: str
    parameters: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class ToolResult:
    """What a tool returned: ``output`` is the text the model reads; ``data`` the structured
    result (e.g. a BuildResult or JudgeResult as a dict) kept in the trajectory."""

    ok: bool
    output: str
    data: dict[str, Any] | None = None
    seconds: float = 0.0


@dataclasses.dataclass(frozen=True)
class TokenView:
    """Token-level record of one policy step, for training: the prompt's ids, the
    response's ids with their log-probabilities under the policy, and the loss mask over the
    response (1 where the policy produced the token)."""

    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    loss_mask: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclasses.dataclass(frozen=True)
class PolicyStep:
    """The policy's answer to one prompt: an assistant message (text and/or tool calls)."""

    message: Message
    usage: Usage = Usage()
    tokens: TokenView | None = None
    seconds: float = 0.0


class PolicyError(RuntimeError):
    """The policy could not answer (server down after retries, bad configuration)."""


class Policy(Protocol):
    """Anything that, given the conversation and the tools, answers with one step."""

    name: str

    def step(self, messages: list[Message], tools: list[ToolSpec]) -> PolicyStep: ...


@dataclasses.dataclass(frozen=True)
class EpisodeResult:
    """How an episode ended: why it stopped, how long it ran, its final judgement."""

    task: str
    policy: str
    stop_reason: StopReason
    turns: int
    prompt_tokens: int
    completion_tokens: int
    seconds: float
    reward: int | None
    final: dict[str, Any] | None
    """The final JudgeResult as a dict (None when the episode could not be judged)."""
    error: str | None = None
    trajectory: str | None = None
    """Path of the recorded trajectory (JSONL)."""


def message_to_dict(message: Message) -> dict[str, Any]:
    """A message as plain JSON data (the trajectory's and the OpenAI wire's shape)."""
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        out["tool_calls"] = [{"id": c.id, "name": c.name, "arguments": c.arguments,
                              "raw_arguments": c.raw_arguments} for c in message.tool_calls]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        out["name"] = message.name
    return out


def message_from_dict(data: dict[str, Any]) -> Message:
    """The inverse of ``message_to_dict``; raises ValueError on a malformed record."""
    if not isinstance(data, dict) or data.get("role") not in ("system", "user", "assistant",
                                                              "tool"):
        raise ValueError(f"not a message record: {str(data)[:200]}")
    calls = []
    for raw in data.get("tool_calls") or []:
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
            raise ValueError(f"malformed tool call: {str(raw)[:200]}")
        args = raw.get("arguments")
        calls.append(ToolCall(id=str(raw.get("id", "")), name=raw["name"],
                              arguments=args if isinstance(args, dict) else None,
                              raw_arguments=str(raw.get("raw_arguments", ""))))
    return Message(role=data["role"], content=str(data.get("content") or ""),
                   tool_calls=tuple(calls), tool_call_id=data.get("tool_call_id"),
                   name=data.get("name"))
