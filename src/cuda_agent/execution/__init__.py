"""Running the agent's commands (docs/sandbox.md) and judge jobs at scale (docs/pool.md).

``RayJudgePool`` is importable from here without ray: ray is imported when one is made.
"""

from cuda_agent.execution.backend import JobFailed, JobHandle, JudgeBackend, PoolStats, make_pool
from cuda_agent.execution.pool import JudgePool, PoolConfig
from cuda_agent.execution.pool_ray import RayJudgePool
from cuda_agent.execution.sandbox import (
    CommandResult,
    Sandbox,
    SandboxConfig,
    SandboxUnavailable,
    make_sandbox,
)

__all__ = ["CommandResult", "JobFailed", "JobHandle", "JudgeBackend", "JudgePool", "PoolConfig",
           "PoolStats", "RayJudgePool", "Sandbox", "SandboxConfig", "SandboxUnavailable",
           "make_pool", "make_sandbox"]
