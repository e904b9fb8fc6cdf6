"""The agent's policies behind one interface (``cuda_agent.agent.types.Policy``).

    make_policy("openai:Qwen/Qwen2.5-Coder-7B-Instruct", base_url="http://host:8000/v1")
    make_policy("hf:/models/checkpoint-200", temperature=0.7)
    make_policy("replay:runs/episode-0001.jsonl")

Heavy libraries (openai, torch, transformers) are imported only when a policy of that kind
is built. See docs/policies.md.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from cuda_agent.agent.types import Policy, PolicyError

FORMS = ("openai:MODEL (options: base_url, api_key, timeout_s, max_retries, backoff_s, "
         "temperature, max_tokens)",
         "hf:PATH (options: device, dtype, max_new_tokens, temperature)",
         "replay:FILE (a trajectory JSONL or a JSON list of assistant messages)")

__all__ = ["FORMS", "make_policy"]


def make_policy(spec: str, **options: Any) -> Policy:
    """Build the policy that ``spec`` names; options left at None are ignored.

    Raises PolicyError for an unknown scheme, a missing model/path, or a bad option."""
    scheme, sep, target = spec.partition(":")
    scheme = scheme.strip().lower()
    target = target.strip()
    if not sep or scheme not in ("openai", "hf", "replay"):
        raise PolicyError(f"unknown policy {spec!r}; accepted forms: " + "; ".join(FORMS))
    if not target:
        raise PolicyError(f"policy {spec!r} names no model; accepted forms: " + "; ".join(FORMS))
    options = {key: value for key, value in options.items() if value is not None}
    if scheme == "openai":
        from cuda_agent.agent.policies.openai_policy import OpenAIConfig, OpenAIPolicy

        return OpenAIPolicy(_config(OpenAIConfig, spec, model=target, **options))
    if scheme == "hf":
        from cuda_agent.agent.policies.hf_policy import HFConfig, HFPolicy

        return HFPolicy(_config(HFConfig, spec, path=target, **options))
    from cuda_agent.agent.policies.replay import ReplayConfig, ReplayPolicy

    return ReplayPolicy(_config(ReplayConfig, spec, path=target, **options).path)


def _config(cls: type[BaseModel], spec: str, **values: Any) -> Any:
    try:
        return cls(**values)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'options'}: {e['msg']}"
                             for e in exc.errors())
        raise PolicyError(f"bad options for policy {spec!r}: {problems}") from exc
