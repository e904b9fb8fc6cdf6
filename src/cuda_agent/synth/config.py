"""Configuration of task synthesis: one pydantic object per component, every field documented.

``SynthConfig`` nests the composer, LLM, filter and run sections; the command line sets any
field with ``--set filters.min_ms_cpu=0.5`` (see ``cuda_agent.cli.overrides``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

FILTER_VERSION = "synth-filters-v3"
"""Bump whenever a filter, threshold or measurement changes; every data set row records it.

History:
- synth-filters-v1: builds/eager/compile, determinism, stochastic ops (tags, source and RNG
  probe), constant, near-zero, identity, per-input sensitivity, redundant intermediate ATen
  ops, NaN/Inf, runtime window, KernelBench AST similarity, structural duplicates.
- synth-filters-v2: degenerate task (a constant, one repeated value or an input passes the
  judge's comparison at every trial of 5 draws and 2 scaled draws).
- synth-filters-v3: borderline refusals near every threshold; mostly-constant outputs;
  statements that return an input unchanged; inputs drawn from one seed for every task;
  KernelBench decontamination on by default, 'skipped' when no copy is found; on the CPU,
  runtimes are CPU time per torch thread (wall time on a GPU).
"""

# The released CUDA-Agent-Ops-6K mix (paper, section 1): 1 op 3.4%, 2 ops 83.8%, 3 ops 7.6%,
# 4 ops 2.8%, 5 ops 1.2%.
PAPER_OPS_MIX = {1: 0.034, 2: 0.838, 3: 0.076, 4: 0.028, 5: 0.012}
CLASS_MIX = {"gemm": 0.14, "conv": 0.1, "attention": 0.04, "norm": 0.12, "activation": 0.28,
             "elementwise": 0.14, "reduction": 0.08, "pool": 0.06, "data_movement": 0.02,
             "loss": 0.01, "other": 0.01}
RARE_OPS = ("torch.chain_matmul", "torch.ldexp", "torch.frexp", "torch.norm_except_dim",
            "torch.nextafter", "torch.mvlgamma", "torch.igamma", "torch.igammac", "torch.i0",
            "torch.vander", "torch.trapezoid", "torch.trapz", "torch.cumulative_trapezoid",
            "torch.slice_inverse", "torch.slice_scatter", "torch.slice_copy", "torch.histc",
            "torch.kron", "torch.ger", "torch.outer", "torch.inner", "torch.dot", "torch.vdot",
            "torch.polar", "torch.complex", "torch.heaviside", "torch.float_power",
            "torch.digamma", "torch.lgamma", "torch.erfinv", "torch.spmm", "torch.dsmm",
            "torch.gradient", "torch.matrix_power", "torch.matrix_exp", "torch.pinverse",
            "torch.qr", "torch.svd", "torch.slogdet", "torch.det", "torch.nuclear_norm",
            "torch.frobenius_norm", "torch.dist", "torch.diagflat", "torch.diag_embed",
            "torch.diag", "torch.diagonal", "torch.diagonal_copy", "torch.alias_copy",
            "torch.asarray", "torch.clone", "torch.positive", "torch.resolve_conj",
            "torch.resolve_neg", "torch.real", "torch.conj", "torch.conj_physical",
            "torch.detach", "torch.detach_copy", "torch.squeeze", "torch.squeeze_copy",
            "torch.t_copy", "torch.unsqueeze_copy", "torch.unsafe_chunk", "torch.unsafe_split",
            "torch.fix", "torch.fill", "torch.angle", "torch.sgn", "torch.copysign",
            "torch.fmod", "torch.remainder", "torch.floor_divide", "torch.frac", "torch.sinc",
            "torch.deg2rad", "torch.rad2deg", "torch.msort", "torch.argsort", "torch.sort",
            "torch.searchsorted", "torch.bucketize", "torch.mode", "torch.kthvalue",
            "torch.nanquantile", "torch.quantile", "torch.nanmedian", "torch.median",
            "torch.cummin", "torch.cummax", "torch.cumprod", "torch.logcumsumexp",
            "torch.trace", "torch.fliplr", "torch.flipud", "torch.rot90", "torch.adjoint",
            "torch.addr", "torch.xlogy", "torch.isclose", "torch.isin", "torch.isreal",
            "transformers.act.linear")
"""Operators models rarely hold (special functions, linear algebra, aliases and copies of
another operator, identities in practice): drawn with ``rare_weight``."""


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
    min_ms_cpu: float = Field(1.0, description="Eager runtime window on CPU, lower bound (ms "
                              "of CPU time per torch thread).")
    max_ms_cpu: float = Field(100.0, description="Eager runtime window on CPU, upper bound (ms).")
    timing_runs: int = Field(5, ge=1, description="Timed eager calls (median is reported).")
    similarity_threshold: float = Field(
        0.9, description="Reject when the normalised-AST similarity to a KernelBench problem "
        "is above this (the paper's 0.9).")
    borderline_factor: float = Field(
        2.0, ge=1, description="A trivial-answer or compile comparison within this factor "
        "of its tolerance is refused as borderline (another draw could flip it); a trivial "
        "answer passing every trial at this multiple of the trivial tolerance too.")
    borderline_time_factor: float = Field(
        1.5, ge=1, description="An eager time within this factor of either edge of the "
        "runtime window is refused as borderline (a busier machine could move it out).")
    similarity_margin: float = Field(
        0.03, ge=0, description="A KernelBench similarity this close below the threshold "
        "is refused as borderline.")
    max_constant_share: float = Field(
        0.95, gt=0, le=1, description="Refuse an output of which this share of elements "
        "one constant (0 or the median) passes at the trivial tolerance (mostly zeros).")
    constant_share_margin: float = Field(
        0.05, ge=0, description="A constant share this close below max_constant_share is "
        "refused as borderline.")
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
    class_mix: dict[str, float] = Field(
        default_factory=lambda: dict(CLASS_MIX),
        description="Weight of each op class (catalog.OP_CLASSES) when an operator is drawn; "
        "a class left out is not drawn.")
    compute_share: float = Field(
        0.75, ge=0, le=1, description="Share of tasks whose first operator is compute-heavy "
        "(gemm, conv, attention), as KernelBench level 2's are.")
    rare_ops: tuple[str, ...] = Field(
        RARE_OPS, description="Operators models rarely hold, drawn with rare_weight.")
    rare_weight: float = Field(
        0.0, ge=0, description="Weight of a rare operator against 1 for others in its class "
        "(0: never drawn).")
    hidden_sizes: tuple[int, ...] = Field(
        (256, 512, 768, 1024, 2048, 4096), description="Feature sizes as models use them: "
        "the last dimension of rank-2/3 inputs, out_features, embedding and MLP widths.")
    seq_lens: tuple[int, ...] = Field(
        (128, 256, 512, 1024, 2048), description="Sequence lengths of rank-3 inputs.")
    channels: tuple[int, ...] = Field(
        (3, 16, 32, 64, 128, 256), description="Channels of rank-4/5 inputs (out_channels: "
        "those of 16 and up).")
    spatial: tuple[int, ...] = Field(
        (14, 28, 32, 56, 64, 112, 128, 224), description="Height and width of rank-4 inputs "
        "(rank 5: those of 64 and below, depth 8-32).")

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
    kernelbench: Path | Literal["auto"] | None = Field(
        "auto", description="KernelBench JSONL or checkout to decontaminate against; 'auto': "
        "the copy at ../shared/kernelbench when found (verdicts say 'skipped' when not); "
        "None: off.")
    recycle_after: int = Field(
        50, ge=1, description="Restart a worker process after this many tasks.")
    filters: FilterConfig = Field(default_factory=FilterConfig, description="Filter thresholds.")
    compose: ComposerConfig = Field(default_factory=ComposerConfig, description="Sampling.")
    llm: LLMConfig = Field(default_factory=LLMConfig, description="LLM endpoint.")

    @property
    def candidate_limit(self) -> int:
        return self.max_candidates if self.max_candidates is not None else 20 * self.count
