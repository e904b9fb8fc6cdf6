"""A policy served over the chat-completions protocol: OpenAI, or any compatible server
(vLLM, SGLang, llama.cpp, TGI) through ``base_url``.

    cuda-agent ... --model openai:Qwen/Qwen2.5-Coder-7B-Instruct --base-url http://host:8000/v1

Retries: connection errors, timeouts, 429 and 5xx are retried up to ``max_retries`` times
with exponential backoff; anything else (bad request, bad key, unknown model) fails at once.
Every failure is a PolicyError that says what happened.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from cuda_agent.agent.policies.calls import make_call
from cuda_agent.agent.types import Message, PolicyError, PolicyStep, ToolSpec, Usage

DUMMY_API_KEY = "EMPTY"
"""Sent when no key is configured: local servers accept any key."""


class OpenAIConfig(BaseModel):
    """How to reach a chat-completions server and sample from it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(min_length=1)
    """The model name the server knows (``--served-model-name`` on vLLM/SGLang)."""
    base_url: str | None = None
    """e.g. ``http://host:8000/v1``; None: the SDK's default (env OPENAI_BASE_URL or OpenAI)."""
    api_key: str | None = None
    """None: env CUDA_AGENT_API_KEY, then OPENAI_API_KEY, then a dummy key."""
    timeout_s: float = Field(default=300.0, gt=0)
    """Limit on one request, in seconds."""
    max_retries: int = Field(default=3, ge=0)
    """Retries after a connection error, timeout, 429 or 5xx."""
    backoff_s: float = Field(default=1.0, ge=0)
    """First wait between retries; doubled after each (capped at 30 s)."""
    temperature: float | None = Field(default=None, ge=0)
    """None: the server's default."""
    max_tokens: int | None = Field(default=None, gt=0)
    """Limit on the completion's tokens; None: the server's default."""


def resolve_api_key(explicit: str | None) -> str:
    """The key to send: the configured one, else from the environment, else a dummy."""
    for value in (explicit, os.environ.get("CUDA_AGENT_API_KEY"),
                  os.environ.get("OPENAI_API_KEY")):
        if value:
            return value
    return DUMMY_API_KEY


def message_to_wire(message: Message) -> dict[str, Any]:
    """One message in the chat-completions request shape."""
    if message.role == "tool":
        return {"role": "tool", "tool_call_id": message.tool_call_id or "",
                "content": message.content}
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.role == "assistant" and message.tool_calls:
        out["content"] = message.content or None
        out["tool_calls"] = [
            {"id": call.id, "type": "function",
             "function": {"name": call.name,
                          "arguments": (json.dumps(call.arguments)
                                        if call.arguments is not None
                                        else call.raw_arguments)}}
            for call in message.tool_calls]
    return out


def tool_to_wire(tool: ToolSpec) -> dict[str, Any]:
    return {"type": "function", "function": {"name": tool.name, "description": tool.description,
                                             "parameters": tool.parameters}}


def message_from_wire(wire: Any) -> Message:
    """The assistant message of a response (an SDK object or a plain dict).

    A refusal becomes the message's text; tool calls whose arguments are not a JSON object
    keep their text in ``raw_arguments`` with ``arguments=None``."""
    data = wire if isinstance(wire, dict) else wire.model_dump()
    content = data.get("content") or data.get("refusal") or ""
    calls = []
    for index, raw in enumerate(data.get("tool_calls") or []):
        function = raw.get("function") or raw.get("custom") or {}
        arguments = function.get("arguments", function.get("input", ""))
        calls.append(make_call(raw.get("id") or f"call-{index}", function.get("name") or "",
                               arguments if arguments is not None else ""))
    return Message(role="assistant", content=str(content), tool_calls=tuple(calls))


class OpenAIPolicy:
    """A chat-completions model as a Policy; no token view (the server keeps its tokens)."""

    def __init__(self, config: OpenAIConfig) -> None:
        try:
            import openai
        except ImportError as exc:  # pragma: no cover - openai is a dependency
            raise PolicyError("the openai policy needs the 'openai' package") from exc
        self.config = config
        self.name = f"openai:{config.model}"
        self._openai = openai
        self._client = openai.OpenAI(base_url=config.base_url,
                                     api_key=resolve_api_key(config.api_key),
                                     timeout=config.timeout_s, max_retries=0)

    def step(self, messages: list[Message], tools: list[ToolSpec]) -> PolicyStep:
        request: dict[str, Any] = {"model": self.config.model,
                                   "messages": [message_to_wire(m) for m in messages]}
        if tools:
            request["tools"] = [tool_to_wire(t) for t in tools]
        if self.config.temperature is not None:
            request["temperature"] = self.config.temperature
        if self.config.max_tokens is not None:
            request["max_tokens"] = self.config.max_tokens
        start = time.monotonic()
        response = self._create(request)
        if not response.choices:
            raise PolicyError(f"{self.name}: the server answered with no choices")
        usage = response.usage
        return PolicyStep(
            message=message_from_wire(response.choices[0].message),
            usage=Usage(prompt_tokens=getattr(usage, "prompt_tokens", 0) or 0,
                        completion_tokens=getattr(usage, "completion_tokens", 0) or 0),
            seconds=time.monotonic() - start)

    def _create(self, request: dict[str, Any]) -> Any:
        errors = self._openai
        attempts = self.config.max_retries + 1
        for attempt in range(attempts):
            try:
                return self._client.chat.completions.create(**request)
            except errors.APITimeoutError as exc:
                reason = f"no answer within timeout_s={self.config.timeout_s:g}s ({exc})"
            except errors.APIConnectionError as exc:
                reason = f"cannot reach {self._client.base_url}: {exc}"
            except errors.APIStatusError as exc:
                reason = f"HTTP {exc.status_code}: {_short(exc.message)}"
                if exc.status_code != 429 and exc.status_code < 500:
                    raise PolicyError(f"{self.name}: request refused, {reason}") from exc
            except errors.OpenAIError as exc:
                raise PolicyError(f"{self.name}: {type(exc).__name__}: {exc}") from exc
            if attempt + 1 < attempts:
                time.sleep(min(30.0, self.config.backoff_s * 2 ** attempt))
        raise PolicyError(f"{self.name}: failed after {attempts} attempt(s); last: {reason}")


def _short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
