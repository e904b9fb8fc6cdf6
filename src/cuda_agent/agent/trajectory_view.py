"""Plain-text rendering of a trajectory's records, for ``cuda-agent trajectories show``."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any


def render(records: Iterable[dict[str, Any]], full: bool = False, width: int = 2000) -> str:
    """A readable transcript: header, messages with tool calls, tool results, judgements,
    and the episode's end. Long texts are cut to ``width`` characters unless ``full``."""
    out: list[str] = []
    for r in records:
        kind = r.get("type")
        if kind == "episode_start":
            out.append(f"=== episode: task {r.get('task')}, policy {r.get('policy')}, "
                       f"started {r.get('time')}")
        elif kind == "message":
            out.extend(_message(r.get("message") or {}, full, width))
        elif kind == "step":
            usage = r.get("usage") or {}
            out.append(f"    [turn {r.get('turn')}: {usage.get('prompt_tokens', 0)} prompt + "
                       f"{usage.get('completion_tokens', 0)} completion tokens, "
                       f"{float(r.get('seconds') or 0):.1f} s"
                       f"{', token ids recorded' if r.get('tokens') else ''}"
                       f"{_from_text(r.get('tool_calls_from_text'))}]")
        elif kind == "tool_result":
            status = "ok" if r.get("ok") else "FAILED"
            out.append(f"    [{r.get('name')} {status} in {float(r.get('seconds') or 0):.1f} s]")
        elif kind == "judge":
            out.append(_judge(r))
        elif kind == "episode_end":
            out.append(_end(r.get("result") or {}))
    return "\n".join(out)


def _from_text(read: Any) -> str:
    """The step's note on tool calls read from the reply's text (``agent/text_calls.py``)."""
    if not isinstance(read, dict):
        return ""
    if read.get("problem"):
        return f"; a tool call in the text could not be read: {read['problem']}"
    return f"; {read.get('calls')} tool call(s) read from the text ({read.get('form')})"


def _cut(text: str, full: bool, width: int) -> str:
    if full or len(text) <= width:
        return text
    return text[: width * 2 // 3] + f"\n[... {len(text) - width} characters ...]\n" + \
        text[len(text) - width // 3:]


def _message(m: dict[str, Any], full: bool, width: int) -> list[str]:
    role = m.get("role", "?")
    label = {"tool": f"tool ({m.get('name') or m.get('tool_call_id')})"}.get(role, role)
    lines = [f"--- {label}"]
    content = str(m.get("content") or "")
    if content:
        lines.append(_cut(content, full or role == "assistant", width))
    for call in m.get("tool_calls") or []:
        args = call.get("arguments")
        shown = (json.dumps(args) if args is not None
                 else f"<invalid JSON> {call.get('raw_arguments')}")
        lines.append(f">>> {call.get('name')}({_cut(shown, full, width // 4)})")
    return lines


def _judge(r: dict[str, Any]) -> str:
    source = r.get("source", "judge")
    result = r.get("result") or {}
    if r.get("error"):
        return f"*** {source}: could not judge: {r['error']}"
    if "reward" not in result:
        return f"*** {source}: ok={result.get('ok')}, {len(result.get('diagnostics') or [])} " \
               "diagnostics"
    line = (f"*** {source}: reward {result.get('reward')} (compiled {result.get('compiled')}, "
            f"correct {result.get('correct')})")
    if result.get("speedup_vs_eager") is not None:
        line += f", {result['speedup_vs_eager']:.2f}x vs eager"
    if result.get("speedup_vs_compile") is not None:
        line += f", {result['speedup_vs_compile']:.2f}x vs compile"
    return "\n".join([line, *(f"    - {reason}" for reason in result.get("reasons") or ())])


def _end(result: dict[str, Any]) -> str:
    line = (f"=== end: {result.get('stop_reason')} after {result.get('turns')} turns, "
            f"{result.get('prompt_tokens')} prompt + {result.get('completion_tokens')} "
            f"completion tokens, {float(result.get('seconds') or 0):.1f} s; reward "
            f"{result.get('reward')}")
    if result.get("error"):
        line += f"\n    error: {result['error']}"
    return line
