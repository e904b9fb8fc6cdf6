"""Keep the conversation the policy sees within its token budget, deterministically.

Two rules, applied to a copy of the history before every policy step (the full history
stays in the trajectory):

1. Tool outputs longer than ``max_tool_output_chars`` keep their head and tail, with a
   marker saying how many characters were cut.
2. When the estimated size passes ``threshold`` x the budget, the old turns (never the
   system prompt, the task message, or the last ``keep_last_turns`` turns) are replaced by
   one user message that lists what was done: every tool call with its key arguments and
   the first line of its outcome (build errors, verify rewards).

Sizes are estimated as characters / 4 unless a token-counting function is passed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pydantic import BaseModel, Field

from cuda_agent.agent.types import Message, ToolCall

SUMMARY_HEADER = "[Summary of earlier turns, compacted to fit the context]"
BULKY_ARGS = ("content", "old", "new", "edits")

TokenCounter = Callable[[Sequence[Message]], int]


class CompactionConfig(BaseModel):
    """How the history is shrunk to fit the context budget."""

    max_tool_output_chars: int = Field(
        12_000, gt=200, description="Tool outputs longer than this keep only head and tail.")
    threshold: float = Field(
        0.75, gt=0, le=1, description="Compact old turns once the estimate passes this "
        "fraction of the budget.")
    keep_last_turns: int = Field(
        4, ge=1, description="The most recent turns (assistant message + its results) that "
        "are always kept verbatim.")
    summary_max_chars: int = Field(
        6_000, gt=200, description="The summary keeps its first and last lines within this.")


def clip(text: str, limit: int) -> str:
    """``text`` cut to about ``limit`` characters, keeping head and tail with a marker."""
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    tail = limit - head
    cut = len(text) - head - tail
    return f"{text[:head]}\n[... {cut} characters cut ...]\n{text[len(text) - tail:]}"


def estimate_tokens(messages: Sequence[Message]) -> int:
    """A tokenizer-free size estimate: about four characters per token."""
    chars = 0
    for m in messages:
        chars += len(m.content) + 16
        for call in m.tool_calls:
            chars += len(call.name) + len(call.raw_arguments or str(call.arguments)) + 16
    return chars // 4


def compact(messages: Sequence[Message], budget_tokens: int, config: CompactionConfig,
            count: TokenCounter | None = None) -> list[Message]:
    """The messages to show the policy: clipped tool outputs, old turns summarised."""
    count = count or estimate_tokens
    out = [_clip_message(m, config.max_tool_output_chars) for m in messages]
    limit = config.threshold * budget_tokens
    if count(out) <= limit:
        return out
    head, turns = _split_turns(out)
    keep = min(config.keep_last_turns, len(turns))
    while True:
        old = [m for turn in turns[:len(turns) - keep] for m in turn]
        recent = [m for turn in turns[len(turns) - keep:] for m in turn]
        candidate = head + ([summarise(old, config.summary_max_chars)] if old else []) + recent
        if count(candidate) <= limit or keep <= 1:
            return candidate
        keep -= 1


def _clip_message(message: Message, limit: int) -> Message:
    if message.role != "tool" or len(message.content) <= limit:
        return message
    return Message(role="tool", content=clip(message.content, limit),
                   tool_call_id=message.tool_call_id, name=message.name)


def _split_turns(messages: list[Message]) -> tuple[list[Message], list[list[Message]]]:
    """(system + task messages, turns); a turn starts at each assistant message."""
    first = next((i for i, m in enumerate(messages) if m.role == "assistant"), len(messages))
    head = messages[:first]
    turns: list[list[Message]] = []
    for m in messages[first:]:
        if m.role == "assistant" or not turns:
            turns.append([m])
        else:
            turns[-1].append(m)
    return head, turns


def summarise(messages: Sequence[Message], max_chars: int) -> Message:
    """One user message listing the tool calls, outcomes and notes of ``messages``."""
    results = {m.tool_call_id: m.content for m in messages if m.role == "tool"}
    lines: list[str] = []
    turn = 0
    for m in messages:
        if m.role == "assistant":
            turn += 1
            if m.content.strip() and not m.tool_calls:
                lines.append(f"- you said: {_first_line(m.content, 120)}")
            for call in m.tool_calls:
                outcome = _first_line(results.get(call.id, "(no result)"), 160)
                lines.append(f"- {describe_call(call)} -> {outcome}")
        elif m.role == "user" and not m.content.startswith(SUMMARY_HEADER):
            lines.append(f"- user: {_first_line(m.content, 120)}")
        elif m.role == "user":
            lines.extend(m.content.splitlines()[1:])
    body = _fit_lines(lines, max_chars)
    return Message(role="user", content=f"{SUMMARY_HEADER}\n{body}")


def describe_call(call: ToolCall) -> str:
    """``name(key=value, ...)`` with long or bulky arguments shortened."""
    if call.arguments is None:
        return f"{call.name}(<invalid JSON arguments>)"
    parts = []
    for key, value in call.arguments.items():
        if key in BULKY_ARGS:
            size = len(value) if isinstance(value, (str, list)) else 0
            unit = "items" if isinstance(value, list) else "chars"
            parts.append(f"{key}=<{size} {unit}>")
        else:
            text = str(value).replace("\n", " ")
            parts.append(f"{key}={text[:60] + '...' if len(text) > 60 else text}")
    return f"{call.name}({', '.join(parts)})"


def _first_line(text: str, limit: int) -> str:
    line = next((s.strip() for s in text.splitlines() if s.strip()), "")
    return line[:limit] + ("..." if len(line) > limit else "")


def _fit_lines(lines: list[str], max_chars: int) -> str:
    text = "\n".join(lines)
    if len(text) <= max_chars:
        return text
    head, tail, size = [], [], 60
    for line in lines:
        if size + len(line) + 1 > max_chars // 3:
            break
        head.append(line)
        size += len(line) + 1
    for line in reversed(lines[len(head):]):
        if size + len(line) + 1 > max_chars:
            break
        tail.insert(0, line)
        size += len(line) + 1
    dropped = len(lines) - len(head) - len(tail)
    return "\n".join([*head, f"- [... {dropped} earlier actions omitted ...]", *tail])
