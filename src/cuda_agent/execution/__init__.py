"""Running the agent's commands (docs/sandbox.md) and judge jobs at scale (docs/pool.md).

Names are imported when first used, so a light part (the episode judge's client, the
sandbox) is reached without importing torch; ``RayJudgePool`` is importable without ray.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "JobFailed": "backend", "JobHandle": "backend", "JudgeBackend": "backend",
    "PoolStats": "backend", "make_pool": "backend", "JudgePool": "pool", "PoolConfig": "pool",
    "RayJudgePool": "pool_ray", "CommandResult": "sandbox", "Sandbox": "sandbox",
    "SandboxConfig": "sandbox", "SandboxUnavailable": "sandbox", "make_sandbox": "sandbox",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'cuda_agent.execution' has no attribute {name!r}")
    return getattr(importlib.import_module(f"cuda_agent.execution.{_WHERE[name]}"), name)
