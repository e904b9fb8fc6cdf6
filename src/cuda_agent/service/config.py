"""Configuration of the environment service: one object, every field documented.

    ServiceConfig(api_keys=["..."], task_roots=["/data/tasks"], pool=PoolConfig(cpu_workers=2))

API keys come from ``api_keys`` and from ``$CUDA_AGENT_API_KEYS`` (comma-separated); the
service refuses to start with none unless ``allow_no_auth`` is set.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from cuda_agent.execution.pool import PoolConfig
from cuda_agent.execution.sandbox import SandboxConfig
from cuda_agent.judge.config import JudgeConfig
from cuda_agent.paths import home_dir

KEYS_ENV = "CUDA_AGENT_API_KEYS"


class ServiceConfigError(ValueError):
    """The service cannot start with this configuration; the message says why."""


def _default_sandbox() -> SandboxConfig:
    return SandboxConfig(timeout_s=60.0, output_limit_bytes=64 * 1024)


class ServiceConfig(BaseModel):
    """How the environment service listens, authenticates, limits and runs episodes."""

    host: str = Field("127.0.0.1", description="Address to listen on (loopback by default; "
                      "put a TLS proxy in front for anything else).")
    port: int = Field(8321, ge=0, le=65535, description="TCP port (0: any free port).")
    api_keys: list[str] = Field(
        default_factory=list, description=f"Accepted API keys; ${KEYS_ENV} (comma-separated) "
        "adds more.")
    allow_no_auth: bool = Field(
        False, description="Serve without any key. Only for a trusted, private network.")
    root: Path | None = Field(
        None, description="Folder holding one sub-folder per episode workspace "
        "(None: $CUDA_AGENT_HOME/service/episodes).")
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="Where episodes build and are judged; 'auto' takes CUDA when a "
        "GPU is present. An episode may only ask for this device.")
    max_episodes: int = Field(64, ge=1, description="Episodes open at once; more get 429.")
    max_request_bytes: int = Field(
        4 * 1024 * 1024, ge=1024, description="Largest request body; larger ones get 413.")
    max_file_bytes: int = Field(
        1024 * 1024, ge=1, description="Largest file read_file returns.")
    max_diff_bytes: int = Field(
        1024 * 1024, ge=1, description="The diff is cut at this size (and says so).")
    max_list_entries: int = Field(5000, ge=1, description="list_files stops after this many.")
    idle_timeout_s: float = Field(
        1800.0, gt=0, description="An episode with no tool call for this long is closed and "
        "its workspace deleted.")
    tool_timeout_s: float = Field(
        900.0, gt=0, description="A request waits this long for a tool; after that it gets "
        "504 while the tool runs to its end (a judgement is still recorded).")
    busy_timeout_s: float = Field(
        60.0, gt=0, description="A call waits this long for the episode's previous call to "
        "end; after that it gets 409.")
    tool_threads: int | None = Field(
        None, ge=1, description="Threads running tool calls (None: 2 x max_episodes + 8).")
    max_local_judges: int = Field(
        2, ge=1, description="verify/profile calls running at once in this process "
        "(each starts two judge processes); the rest wait.")
    sandbox: SandboxConfig = Field(default_factory=_default_sandbox,
                                   description="Limits of the agent's shell commands.")
    judge: JudgeConfig = Field(
        default_factory=JudgeConfig, description="Judge of the verify and profile tools "
        "(device follows the episode; verify turns timing off) and build options.")
    pool: PoolConfig = Field(
        default_factory=PoolConfig, description="The judge queue behind the judge tool; its "
        "judge.device follows ``device``.")
    task_roots: list[Path] = Field(
        default_factory=list, description="Folders whose files clients may name as tasks, by "
        "a path relative to a root (e.g. 'kernelbench.jsonl::1/19').")
    allow_builtin: bool = Field(True, description="Allow builtin:NAME tasks.")

    def keys(self) -> list[str]:
        """Every accepted key: the configured ones and those in $CUDA_AGENT_API_KEYS."""
        extra = [k.strip() for k in os.environ.get(KEYS_ENV, "").split(",")]
        return [k for k in dict.fromkeys([*self.api_keys, *extra]) if k]

    def check(self) -> None:
        """Raise ``ServiceConfigError`` when the service must not start like this."""
        if not self.keys() and not self.allow_no_auth:
            raise ServiceConfigError(
                f"no API key: give one (--key, api_keys or ${KEYS_ENV}) or allow "
                "unauthenticated access explicitly (allow_no_auth / --allow-no-auth)")
        if any(len(k) < 8 for k in self.keys()):
            raise ServiceConfigError("API keys must be at least 8 characters long")

    def episodes_root(self) -> Path:
        return Path(self.root) if self.root else home_dir() / "service" / "episodes"

    def threads(self) -> int:
        return self.tool_threads or 2 * self.max_episodes + 8
