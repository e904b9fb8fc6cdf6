"""Configuration of task synthesis: one pydantic object per component, every field documented.

``SynthConfig`` nests the composer, LLM, filter and run sections; the command line sets any
field with ``--set filters.min_ms_cpu=0.5`` (see ``cuda_agent.cli.overrides``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

FILTER_VERSION = "synth-filters-v2"
"""Bump whenever a filter, threshold or measurement changes; every data set row records it.

History:
- synth-filters-v1: builds/eager/compile, determinism, stochastic ops (tags, source and RNG
  probe), constant, near-zero, identity, per-input sensitivity, redundant intermediate ATen
  ops, NaN/Inf, runtime window, KernelBench AST similarity, structural duplicates.
- synth-filters-v2: degenerate task (a constant, one repeated value or an input passes the
  judge's comparison at every trial of 5 draws and 2 scaled draws).
"""

# The released CUDA-Agent-Ops-6K mix (paper, section 1): 1 op 3.4%, 2 ops 83.8%, 3 ops 7.6%,
# 4 ops 2.8%, 5 ops 1.2%.
PAPER_OPS_MIX = {1: 0.034, 2: 0.838, 3: 0.076, 4: 0.028, 5: 0.012}


class FilterConfig(BaseModel):
    """Thresholds of the task filters (docs/synthesis.md explains each one)."""

    compile_check: bool = Field(
        True, description="Run the task under torch.compile and compare with eager (slow on CPU).")
    compile_rtol: float = Field(1e-2, description="Relative tolerance, compiled vs eager output.")
    compile_atol: float = Field(1e-3, description="Absolute tolerance, compiled vs eager output.")
    determinism_tol: float = Field(
        0.0, description="Max relative difference between two runs with the same seed.")
    trivial_atol: float = Field(
        1e-2, description="A trivial answer (a fixed tensor, zeros, an input, the output for "
        "other inputs) must fail an element-wise check at this atol; KernelBench's value.")
    trivial_rtol: float = Field(1e-2, description="rtol of the same check.")
    degenerate_trials: int = Field(
        5, ge=1, description="Input draws on which a degenerate task's trivial answer (a "
        "constant, one repeated value, an input) must pass, as the judge's trials.")
    degenerate_scales: tuple[float, ...] = Field(
        (0.25, 4.0), description="Further draws with floating inputs multiplied by these, "
        "as the judge's scaled trials (a constant rarely passes them all).")
    degenerate_atol: float | None = Field(
        None, description="atol of the degenerate-task check; None: the judge's per output "
        "dtype (cuda_agent.tasks.tolerance).")
    degenerate_rtol: float | None = Field(
        None, description="rtol of the same; None: the judge's per output dtype.")
    identity_rtol: float = Field(
        0.0, description="rtol under which a traced operator 'returns its input unchanged' "
        "(0: bit-exact, so adding an epsilon to a variance is not a no-op).")
    identity_atol: float = Field(0.0, description="atol of the same (redundant-op) check.")
    redundant_ops: bool = Field(
        True, description="Trace ATen ops in forward; reject when one is the identity on its "
        "input or turns a varying input into a constant (a no-op or dead part).")
    min_ms_gpu: float = Field(1.0, description="Eager runtime window on CUDA, lower bound (ms).")
    max_ms_gpu: float = Field(100.0, description="Eager runtime window on CUDA, upper bound (ms).")
    min_ms_cpu: float = Field(1.0, description="Eager runtime window on CPU, lower bound (ms).")
    max_ms_cpu: float = Field(100.0, description="Eager runtime window on CPU, upper bound (ms).")
    timing_runs: int = Field(5, ge=1, description="Timed eager calls (median is reported).")
    similarity_threshold: float = Field(
        0.9, description="Reject when the normalised-AST similarity to a KernelBench problem "
        "is above this (the paper's 0.9).")
    task_timeout_s: float = Field(
        300.0, gt=0, description="A task whose whole check takes longer fails with 'timeout'.")
    max_numel: int | None = Field(
        None, description="Shrink module-level size constants until every input, output and "
        "the parameters hold at most this many elements (for CPU audits of big tasks).")

    def window_ms(self, device: str) -> tuple[float, float]:
        if device == "cuda":
            return self.min_ms_gpu, self.max_ms_gpu
        return self.min_ms_cpu, self.max_ms_cpu


class ComposerConfig(BaseModel):
    """How seed operators are sampled and sized (both composers)."""

    ops_mix: dict[int, float] = Field(
        default_factory=lambda: dict(PAPER_OPS_MIX),
        description="Probability of each ops-per-task count (normalised; 1-5).")
    transformers_share: float = Field(
        0.012, ge=0, le=1, description="Share of tasks that include a transformers block "
        "(1.2% in the released set).")
    min_numel_cpu: int = Field(1 << 17, description="Smallest first-input size sampled on CPU.")
    max_numel_cpu: int = Field(1 << 20, description="Largest first-input size sampled on CPU.")
    min_numel_gpu: int = Field(1 << 21, description="Smallest first-input size sampled on CUDA.")
    max_numel_gpu: int = Field(1 << 25, description="Largest first-input size sampled on CUDA.")
    max_intermediate_numel: int = Field(
        1 << 27, description="Reject a composition whose tensors or weights exceed this size.")
    retries: int = Field(30, description="Attempts to find a compatible next operator.")

    def numel_range(self, device: str) -> tuple[int, int]:
        if device == "cuda":
            return self.min_numel_gpu, self.max_numel_gpu
        return self.min_numel_cpu, self.max_numel_cpu


class LLMConfig(BaseModel):
    """An OpenAI-compatible chat-completions endpoint for the LLM composer."""

    base_url: str = Field(
        "", description="Endpoint, e.g. http://localhost:8000/v1; default $OPENAI_BASE_URL.")
    model: str = Field("", description="Model name; default $CUDA_AGENT_LLM_MODEL.")
    api_key_env: str = Field(
        "OPENAI_API_KEY", description="Environment variable holding the API key.")
    temperature: float = Field(0.7, description="Sampling temperature.")
    max_tokens: int = Field(2048, description="Longest reply.")
    timeout_s: float = Field(120.0, description="Per-request timeout.")
    attempts: int = Field(2, ge=1, description="Requests per task before giving up.")


class SynthConfig(BaseModel):
    """A synthesis run: how many tasks, where, how they are made and filtered."""

    count: int = Field(30, ge=1, description="Accepted tasks wanted.")
    device: Literal["cpu", "cuda"] = Field("cpu", description="Where tasks are run and timed.")
    composer: Literal["rules", "llm"] = Field("rules", description="Which composer makes tasks.")
    seed: int = Field(0, description="Base seed; candidate i is made from seed + i.")
    workers: int = Field(2, ge=1, description="Parallel worker processes.")
    max_candidates: int | None = Field(
        None, description="Stop after this many candidates (default 20 x count).")
    resize_attempts: int = Field(
        2, ge=0, description="Re-size a candidate whose runtime is outside the window this "
        "many times (sizes scaled by the runtime ratio).")
    catalog: Path | None = Field(None, description="Catalog file; default the shipped one.")
    kernelbench: Path | None = Field(
        None, description="KernelBench JSONL or checkout to decontaminate against.")
    recycle_after: int = Field(
        50, ge=1, description="Restart a worker process after this many tasks.")
    filters: FilterConfig = Field(default_factory=FilterConfig, description="Filter thresholds.")
    compose: ComposerConfig = Field(default_factory=ComposerConfig, description="Sampling.")
    llm: LLMConfig = Field(default_factory=LLMConfig, description="LLM endpoint.")

    @property
    def candidate_limit(self) -> int:
        return self.max_candidates if self.max_candidates is not None else 20 * self.count
