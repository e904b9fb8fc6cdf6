"""Tool-call decoding shared by the policies: JSON arguments that may be malformed, and the
``<tool_call>{...}</tool_call>`` blocks a local model writes in plain text.

A model's tool call is never trusted: arguments that are not a JSON object become
``ToolCall(arguments=None, raw_arguments=<text>)`` so the loop can tell the model what was
wrong instead of crashing.
"""

from __future__ import annotations

import json
import re
from typing import Any

from cuda_agent.agent.types import ToolCall

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
_BLOCK = re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)(?:" + re.escape(TOOL_CALL_CLOSE) + r"|\Z)",
                    re.DOTALL)


def decode_arguments(raw: Any) -> dict[str, Any] | None:
    """The arguments as a dict: a dict is kept, a JSON-object string is decoded; anything
    else (invalid JSON, a list, a number) is None."""
    if isinstance(raw, dict):
        return raw
    if not isinstance(raw, str):
        return None
    text = raw.strip() or "{}"
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def make_call(call_id: str, name: str, raw: Any) -> ToolCall:
    """A ToolCall whose ``raw_arguments`` is filled only when the arguments did not decode."""
    arguments = decode_arguments(raw)
    if arguments is not None:
        return ToolCall(id=call_id, name=name, arguments=arguments)
    text = raw if isinstance(raw, str) else json.dumps(raw, default=str)
    return ToolCall(id=call_id, name=name, arguments=None, raw_arguments=text)


def parse_tool_calls(text: str, id_prefix: str = "call") -> tuple[str, tuple[ToolCall, ...]]:
    """Split a model's text into (content, tool calls).

    Each ``<tool_call>{"name": "...", "arguments": {...}}</tool_call>`` block is one call
    (``"parameters"`` is accepted for ``"arguments"``, and arguments may be a JSON string of
    an object). A block that is not such an object -- invalid JSON, no name, or cut off by the
    token limit before ``</tool_call>`` -- is still a call, with ``arguments=None`` and the
    block's text in ``raw_arguments`` (its name is kept when it could be read). The content is
    the text with the blocks removed, stripped. Call ids are ``{id_prefix}-{index}``.
    """
    calls: list[ToolCall] = []
    for index, match in enumerate(_BLOCK.finditer(text)):
        calls.append(_block_to_call(match.group(1).strip(), f"{id_prefix}-{index}"))
    content = _BLOCK.sub("", text).strip()
    return content, tuple(calls)


def _block_to_call(body: str, call_id: str) -> ToolCall:
    try:
        value = json.loads(body)
    except (json.JSONDecodeError, RecursionError):
        value = None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        name = _name_guess(body)
        return ToolCall(id=call_id, name=name, arguments=None, raw_arguments=body)
    raw = value.get("arguments", value.get("parameters", {}))
    call = make_call(call_id, value["name"], raw)
    if call.arguments is None:
        return ToolCall(id=call_id, name=call.name, arguments=None, raw_arguments=body)
    return call


def _name_guess(body: str) -> str:
    match = re.search(r'"name"\s*:\s*"([^"\\]{1,100})"', body)
    return match.group(1) if match else ""
