"""Configuration of the judge: one object, every field documented."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from cuda_agent.build.builder import BuildConfig

JUDGE_VERSION = "judge-v1"
"""Bump whenever correctness, timing or reward rules change; results record it.

History: judge-v1 -- separate processes, seeded trials, per-dtype tolerances, milestone reward.
"""


class JudgeConfig(BaseModel):
    """How a candidate is checked and timed."""

    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="Where to run: 'auto' takes CUDA when a GPU is present.")
    seed: int = Field(42, description="Base seed; trial i draws its inputs with seed + i.")
    trials: int = Field(5, ge=1, description="Correctness trials, each with fresh inputs.")
    check: bool = Field(True, description="Compare outputs with the reference.")
    time: bool = Field(True, description="Time the candidate and the eager baseline.")
    time_compile: bool = Field(True, description="Also time the torch.compile baseline.")
    warmup: int = Field(3, ge=0, description="Untimed calls before timing.")
    min_runs: int = Field(10, ge=1, description="Timed calls at least.")
    max_runs: int = Field(200, ge=1, description="Timed calls at most.")
    time_budget_s: float = Field(3.0, gt=0, description="Stop timing after this much wall time.")
    process_timeout_s: float = Field(600.0, gt=0, description="Limit for each worker process.")
    atol: float | None = Field(None, description="Absolute tolerance; default per dtype.")
    rtol: float | None = Field(None, description="Relative tolerance; default per dtype.")
    faster_margin: float = Field(0.95, description="Faster means runtime < margin x baseline.")
    build: BuildConfig = Field(default_factory=BuildConfig, description="Kernel build options.")
