"""The agent's workspace: SKILL.md, the frozen reference, ModelNew, bindings, kernels, utils."""

from cuda_agent.workspace.init import WorkspaceError, init_workspace, read_workspace

__all__ = ["WorkspaceError", "init_workspace", "read_workspace"]
