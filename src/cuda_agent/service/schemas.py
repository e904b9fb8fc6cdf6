"""Request and response bodies of the service (they make its OpenAPI spec).

Requests forbid unknown fields, so a misspelt field is a 422 naming it, never ignored.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    return value


class OpenEpisode(Request):
    task: str = Field(min_length=1, max_length=1024, description="builtin:NAME, or a task "
                      "file relative to a task root of the service, with an optional "
                      "'::SELECTOR'.", examples=["builtin:gelu_bias_scale"])
    device: Literal["cpu", "cuda"] | None = Field(
        None, description="Must be the service's device; omitted: the service's device.")

    _nul = field_validator("task")(_no_nul)


class ShellCall(Request):
    command: str = Field(min_length=1, max_length=100_000,
                         description="Run with /bin/sh -c in the workspace, in the sandbox.")
    timeout_s: float | None = Field(
        None, gt=0, description="Wall-clock limit; at most the service's sandbox limit.")

    _nul = field_validator("command")(_no_nul)


class PathCall(Request):
    path: str = Field(".", min_length=1, max_length=1024,
                      description="Relative to the workspace; no '..', not absolute.")


class WriteCall(Request):
    path: str = Field(min_length=1, max_length=1024,
                      description="Relative to the workspace; folders are created.")
    content: str = Field(description="UTF-8 text; replaces the file.")


class EpisodeOut(BaseModel):
    handle: str = Field(description="The episode's secret handle: keep it private.")
    task: str
    device: str
    files: list[str] = Field(description="The workspace's files at open.")


class EpisodeStatus(BaseModel):
    task: str
    device: str
    age_s: float
    judgements: int


class ShellOut(BaseModel):
    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool
    killed_reason: str | None
    truncated: bool = Field(description="stdout or stderr was cut at the service's limit.")
    seconds: float
    isolation: list[str] = Field(description="Protections in force for this command.")


class FileOut(BaseModel):
    path: str
    content: str
    size: int


class WriteOut(BaseModel):
    path: str
    size: int


class Entry(BaseModel):
    path: str
    kind: Literal["file", "dir", "link"]
    size: int


class ListOut(BaseModel):
    path: str
    entries: list[Entry]
    truncated: bool


class BuildOut(BaseModel):
    ok: bool
    result: dict[str, Any] = Field(description="The BuildResult as JSON.")


class VerdictOut(BaseModel):
    reward: int
    correct: bool
    result: dict[str, Any] = Field(description="The JudgeResult as JSON.")


class JudgementOut(BaseModel):
    judgement_id: int = Field(description="Unique over the service's life.")
    reward: int | None = Field(description="None when no verdict could be made.")
    failure: str | None = Field(description="Why there is no verdict, if there is none.")
    seconds: float
    result: dict[str, Any] | None = Field(description="The JudgeResult as JSON.")


class RewardOut(BaseModel):
    reward: int | None = Field(description="Of the last judgement; None before any.")
    judgements: int
    last: JudgementOut | None


class JudgementsOut(BaseModel):
    judgements: list[JudgementOut]


class DiffOut(BaseModel):
    diff: str = Field(description="Unified diff of the text files since the episode opened.")
    added: list[str]
    removed: list[str]
    changed: list[str]
    truncated: bool


class ClosedOut(BaseModel):
    closed: bool
    judgements: int


class ErrorOut(BaseModel):
    error: str


class HealthOut(BaseModel):
    status: Literal["ok"]
    version: str
    device: str
