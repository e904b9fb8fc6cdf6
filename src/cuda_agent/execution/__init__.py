"""Running the agent's commands (docs/sandbox.md) and judge jobs at scale (docs/pool.md)."""

from cuda_agent.execution.pool import JobFailed, JudgePool, PoolConfig
from cuda_agent.execution.sandbox import (
    CommandResult,
    Sandbox,
    SandboxConfig,
    SandboxUnavailable,
    make_sandbox,
)

__all__ = ["CommandResult", "JobFailed", "JudgePool", "PoolConfig", "Sandbox", "SandboxConfig",
           "SandboxUnavailable", "make_sandbox"]
