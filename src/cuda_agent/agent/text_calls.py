"""Tool calls a model wrote in its reply's text, read by the loop.

A chat-completions server that serves an open model without a tool-call parser (vLLM or
SGLang started without ``--tool-call-parser``) passes the model's calls through as text in
``content``. The loop reads the forms such models write, and the trajectory's ``step``
record says so (``tool_calls_from_text``):

- ``tagged``: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks;
- ``json``: the whole reply is one such JSON object (or a list of them);
- ``fenced``: a fenced block (```json ... ```) holds one, with prose around it.

``{"type": "function", "function": {...}}`` and ``"parameters"`` for ``"arguments"`` are
read too. A reply that looks like a call (a tag, or JSON naming ``name`` and ``arguments``)
but cannot be read gets ``problem``: the loop ends the episode with it, where taking the
reply as prose would end the episode quietly with nothing done.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from cuda_agent.agent.policies.calls import (
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    make_call,
    parse_tool_calls,
)
from cuda_agent.agent.types import Message, ToolCall

FORMS = ("tagged", "json", "fenced", "unreadable")
PARSER_HINT = ("the model writes its tool calls as text and the server passes them through "
               "unparsed: start the server with a tool-call parser for this model (vLLM: "
               "--enable-auto-tool-choice --tool-call-parser NAME; SGLang: --tool-call-parser "
               "NAME)")
_MARKERS = (TOOL_CALL_OPEN, TOOL_CALL_CLOSE, "<function=", "<|python_tag|>", "[TOOL_CALLS]",
            "<tool_use>", "<|tool_call", "<｜tool▁call")
"""Tags open models put around a tool call in their text."""
_FENCE = re.compile(r"```[A-Za-z]*[ \t]*\n(.*?)```", re.DOTALL)
_CALL_KEYS = re.compile(r'"name"\s*:.*"(?:arguments|parameters)"\s*:', re.DOTALL)


@dataclasses.dataclass(frozen=True)
class TextCalls:
    """What the loop read from a reply's text: the reply with the calls as ``tool_calls``
    and the text they were in removed, the form they were written in, and, for a call it
    could not read, the problem (``form`` is then ``unreadable``)."""

    message: Message
    form: str
    problem: str | None = None

    def record(self, original: str) -> dict[str, Any]:
        """The trajectory's ``tool_calls_from_text`` field."""
        return {"form": self.form, "calls": len(self.message.tool_calls),
                "problem": self.problem, "content": original}


def read_text_calls(message: Message, id_prefix: str) -> TextCalls | None:
    """The tool calls ``message``'s text holds, or None where it has structured calls or its
    text is prose. Call ids are ``{id_prefix}-{index}``."""
    if message.tool_calls or not message.content.strip():
        return None
    text = message.content
    if TOOL_CALL_OPEN in text or TOOL_CALL_CLOSE in text:
        content, calls = parse_tool_calls(text, id_prefix)
        bad = [c for c in calls if c.arguments is None and not _named_object(c.raw_arguments)]
        if calls and not bad:
            return TextCalls(dataclasses.replace(message, content=content, tool_calls=calls),
                             "tagged")
        return _unreadable(message, "a <tool_call> block that is not a JSON object with a "
                           "name and arguments", bad[0].raw_arguments if bad else text)
    whole = _objects(text.strip())
    if whole is not None:
        return TextCalls(dataclasses.replace(message, content="",
                                             tool_calls=_calls(whole, id_prefix)), "json")
    content, found = text, []
    for block in _FENCE.finditer(text):
        objects = _objects(block.group(1).strip())
        if objects is not None:
            found += objects
            content = content.replace(block.group(0), "", 1)
    if found:
        return TextCalls(dataclasses.replace(message, content=content.strip(),
                                             tool_calls=_calls(found, id_prefix)), "fenced")
    marker = next((m for m in _MARKERS if m in text), None)
    if marker is not None:
        return _unreadable(message, f"the tag {marker}", text)
    if _looks_like_json_call(text):
        return _unreadable(message, "JSON with a name and arguments that does not decode", text)
    return None


def _objects(text: str) -> list[dict[str, Any]] | None:
    """The calls ``text`` is, as JSON: one object or a list of objects, each with a
    ``name`` and ``arguments`` (or ``parameters``); None when it is anything else."""
    if not text.startswith(("{", "[")):
        return None
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return None
    items = value if isinstance(value, list) else [value]
    calls = [_call_object(item) for item in items]
    return calls if calls and all(c is not None for c in calls) else None


def _call_object(item: Any) -> dict[str, Any] | None:
    if isinstance(item, dict) and isinstance(item.get("function"), dict):
        item = item["function"]  # {"type": "function", "function": {...}}
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        return None
    if "arguments" not in item and "parameters" not in item:
        return None
    return item


def _named_object(raw: str) -> bool:
    """Whether a tagged block whose arguments did not decode is still a named JSON object
    (a call with bad arguments, which the tools answer, not an unreadable one)."""
    try:
        value = json.loads(raw)
    except (json.JSONDecodeError, RecursionError):
        return False
    return _call_object(value) is not None


def _calls(objects: list[dict[str, Any]], id_prefix: str) -> tuple[ToolCall, ...]:
    return tuple(make_call(f"{id_prefix}-{i}", o["name"],
                           o["arguments"] if "arguments" in o else o["parameters"])
                 for i, o in enumerate(objects))


def _looks_like_json_call(text: str) -> bool:
    """A reply that is, or fences, JSON naming ``name`` and ``arguments`` (it did not
    decode, or ``read_text_calls`` would have read it)."""
    pieces = [text.strip(), *(b.group(1).strip() for b in _FENCE.finditer(text))]
    return any(p.startswith(("{", "[")) and _CALL_KEYS.search(p) for p in pieces)


def _unreadable(message: Message, what: str, text: str) -> TextCalls:
    snippet = " ".join(text.split())[:200]
    return TextCalls(message, "unreadable",
                     f"the reply holds a tool call the agent cannot read ({what}: "
                     f"{snippet!r}); {PARSER_HINT}")
