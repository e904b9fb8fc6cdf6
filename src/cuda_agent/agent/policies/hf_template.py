"""Rendering a conversation for a local model: the tokenizer's own chat template when it has
one, else the built-in plain template below.

The plain template (used for base models and tokenizers without ``chat_template``)::

    <|system|>
    {system text}

    # Tools
    To call a tool, write a block <tool_call>{"name": ..., "arguments": {...}}</tool_call>.
    Available tools, one JSON object per line:
    {"name": ..., "description": ..., "parameters": {...}}
    {END}
    <|user|>
    {user text}
    {END}
    <|assistant|>
    {text}
    <tool_call>{"name": "run", "arguments": {"command": "make"}}</tool_call>
    {END}
    <|tool|>
    {tool output}
    {END}
    <|assistant|>

``{END}`` is the tokenizer's end-of-sequence token (so generation stops on it), or the text
``<|end|>`` when the tokenizer has none. The tools section appears only when there are tools;
a system block is opened for it when the conversation has no system message.
"""

from __future__ import annotations

import json
from typing import Any

from cuda_agent.agent.policies.calls import TOOL_CALL_CLOSE, TOOL_CALL_OPEN
from cuda_agent.agent.types import Message, ToolSpec

PLAIN_END = "<|end|>"
TOOLS_HEADER = (f"# Tools\nTo call a tool, write a block {TOOL_CALL_OPEN}"
                '{"name": ..., "arguments": {...}}' f"{TOOL_CALL_CLOSE}.\n"
                "Available tools, one JSON object per line:")


def end_marker(tokenizer: Any) -> str:
    """The text that closes a turn in the plain template."""
    return getattr(tokenizer, "eos_token", None) or PLAIN_END


def tool_dict(tool: ToolSpec) -> dict[str, Any]:
    return {"type": "function", "function": {"name": tool.name, "description": tool.description,
                                             "parameters": tool.parameters}}


def call_block(name: str, arguments: Any) -> str:
    """One tool call written the way the model is asked to write it."""
    return f"{TOOL_CALL_OPEN}{json.dumps({'name': name, 'arguments': arguments})}{TOOL_CALL_CLOSE}"


def render_plain(messages: list[Message], tools: list[ToolSpec], end: str) -> str:
    """The plain template (see the module docstring), ending with an open assistant turn."""
    parts: list[str] = []
    system = [m.content for m in messages if m.role == "system"]
    if system or tools:
        text = "\n\n".join(system)
        if tools:
            lines = [json.dumps({"name": t.name, "description": t.description,
                                 "parameters": t.parameters}) for t in tools]
            text = (text + "\n\n" if text else "") + TOOLS_HEADER + "\n" + "\n".join(lines)
        parts.append(f"<|system|>\n{text}\n{end}\n")
    for message in messages:
        if message.role == "system":
            continue
        body = message.content
        if message.role == "assistant" and message.tool_calls:
            blocks = [call_block(c.name, c.arguments if c.arguments is not None
                                 else c.raw_arguments) for c in message.tool_calls]
            body = "\n".join([body, *blocks]) if body else "\n".join(blocks)
        parts.append(f"<|{message.role}|>\n{body}\n{end}\n")
    parts.append("<|assistant|>\n")
    return "".join(parts)


def template_messages(messages: list[Message]) -> list[dict[str, Any]]:
    """Messages in the shape Hugging Face chat templates expect (arguments as dicts)."""
    out: list[dict[str, Any]] = []
    for message in messages:
        item: dict[str, Any] = {"role": message.role, "content": message.content}
        if message.tool_calls:
            item["tool_calls"] = [
                {"id": c.id, "type": "function",
                 "function": {"name": c.name, "arguments": c.arguments
                              if c.arguments is not None else c.raw_arguments}}
                for c in message.tool_calls]
        if message.tool_call_id is not None:
            item["tool_call_id"] = message.tool_call_id
        if message.name is not None:
            item["name"] = message.name
        out.append(item)
    return out


def render_prompt(tokenizer: Any, messages: list[Message], tools: list[ToolSpec]) -> str:
    """The prompt text: the tokenizer's chat template (with ``tools=``) if it has one, else
    the plain template; both end where the assistant's answer begins."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(
            template_messages(messages), tools=[tool_dict(t) for t in tools] or None,
            add_generation_prompt=True, tokenize=False)
    return render_plain(messages, tools, end_marker(tokenizer))
