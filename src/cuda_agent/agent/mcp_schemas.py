"""The structured content each MCP tool returns, as the output schemas the server advertises
(``tools/list``'s ``outputSchema``). The server checks each reply against its schema before
it answers, so a schema never promises what a tool does not return.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class WorkspaceInfoOut(BaseModel):
    """The task, the device, the files the tools may edit and read, and the playbook."""

    task: str = Field(description="The task's name.")
    device: str = Field(description="cpu or cuda: where the kernels run.")
    precision: str = Field(description="The task's declared precision (fp32, tf32, ...).")
    root: str = Field(description="The workspace folder.")
    editable: list[str] = Field(description="The editable files present now.")
    editable_rule: str = Field(description="Which files the file tools may write.")
    readable: list[str] = Field(description="Fixed files read_file may read.")
    skill: str = Field(description="The SKILL.md playbook.")


class ReadFileOut(BaseModel):
    """A file's text."""

    path: str
    text: str
    bytes: int = Field(description="The file's size in bytes.")


class WriteFileOut(BaseModel):
    """The file written."""

    path: str
    bytes: int = Field(description="Bytes written.")


class DeleteFileOut(BaseModel):
    """The file deleted."""

    path: str
    deleted: bool


class DiagnosticOut(BaseModel):
    """One compiler message."""

    file: str | None
    line: int | None
    column: int | None
    severity: str = Field(description="error, fatal error or warning.")
    message: str


class BuildOut(BaseModel):
    """An incremental build of kernels/ into the cuda_extension module."""

    ok: bool
    device: str
    seconds: float
    compiled: list[str] = Field(description="Sources compiled by this build.")
    cached: list[str] = Field(description="Sources whose objects came from the cache.")
    errors: list[DiagnosticOut]
    warnings: list[DiagnosticOut]
    log: str | None = Field(None, description="The build log's tail, when a failure has no "
                            "diagnostics.")


class _Verdict(BaseModel):
    """What every judgement returns."""

    task: str
    device: str
    precision: str
    compiled: bool
    correct: bool
    reward: int = Field(description="-1 wrong, 1 correct, 2 faster than eager, 3 faster than "
                        "eager and torch.compile.")
    reasons: list[str] = Field(description="Why the reward is what it is.")


class _Timed(_Verdict):
    runtime_ms: float | None
    eager_ms: float | None
    compile_ms: float | None
    speedup_vs_eager: float | None
    speedup_vs_compile: float | None


class VerifyOut(_Verdict):
    """Correctness on seeded inputs, without timing (reward 1 or -1)."""

    trials: int = Field(description="Correctness trials at scale 1, as configured (--set "
                        "trials=N).")
    scales: list[float] = Field(description="The extra trials' input scales, as configured "
                                "(--set scales=[...]).")
    checked_calls: int | None = Field(None, description="Calls compared in all: the trials "
                                      "and the scaled ones (fewer where a slow task's check "
                                      "budget cut them); None when none was compared.")
    max_abs_error: float | None = None
    max_rel_error: float | None = None
    flags: list[str]
    build: BuildOut | None = Field(None, description="The build, when it failed.")


class ProfileOut(_Timed):
    """Correctness and timing against eager PyTorch and torch.compile, with the operators'
    profile."""

    flags: list[str]
    profile: str = Field(description="The candidate's operator profile.")
    timing: dict[str, Any] | None = Field(description="The candidate's timing statistics.")


class JudgeOut(_Timed):
    """The full judgement, as ``cuda-agent judge --json`` prints it: the summary, then the
    build, correctness and timing details."""

    model_config = ConfigDict(extra="allow")
