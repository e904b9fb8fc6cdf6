"""Running the agent's commands: the sandbox (see docs/sandbox.md)."""

from cuda_agent.execution.sandbox import (
    CommandResult,
    Sandbox,
    SandboxConfig,
    SandboxUnavailable,
    make_sandbox,
)

__all__ = ["CommandResult", "Sandbox", "SandboxConfig", "SandboxUnavailable", "make_sandbox"]
