"""``cuda-agent mcp WORKSPACE``: serve a workspace to any MCP client over stdio.

    cuda-agent mcp path/to/ws                       # full judge settings
    cuda-agent mcp path/to/ws --set trials=2 --set time_compile=false

Standard output carries the protocol only; logs and compiler chatter go to standard error.
"""

from __future__ import annotations

from pathlib import Path

import typer

from cuda_agent.cli import overrides
from cuda_agent.cli.exits import bad_input


def mcp(
    workspace: Path = typer.Argument(..., help="The workspace (from `cuda-agent workspace init`)."),
    sets: list[str] = typer.Option([], "--set", help="Judge override KEY=VALUE, repeatable "
                                   "(e.g. --set trials=2 --set time=false)."),
    max_file_bytes: int = typer.Option(1_000_000, min=1, help="Largest file the file tools "
                                       "read or write, in bytes."),
) -> None:
    """Serve WORKSPACE over the Model Context Protocol (stdio): workspace_info, read_file,
    write_file, delete_file, build, verify, profile and judge."""
    from cuda_agent.agent.mcp_server import McpConfig, build_server
    from cuda_agent.judge import JudgeConfig
    from cuda_agent.workspace import WorkspaceError

    judge = overrides.apply(JudgeConfig(), sets)
    try:
        server = build_server(workspace, McpConfig(judge=judge, max_file_bytes=max_file_bytes))
    except WorkspaceError as exc:
        raise bad_input(exc) from None
    server.run("stdio")
