"""The seed-operator catalog: one JSON object a line, one line per crawled operator.

An entry says how to build and call the operator in task code (``init_code`` and
``call_code`` are format strings), which inputs it takes, which ranks of the first input it
accepts, what it produced on the example input, and its tags. ``params`` values that are
strings ``"$k"`` bind to dimension ``k`` of the operator's first input when a task is
composed (``"$1"``: channels, ``"$-1"``: features). The shipped catalog lives in
``cuda_agent/synth/data/catalog.jsonl``; ``cuda-agent synth catalog`` regenerates it.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

TAGS = ("elementwise", "reduction", "matmul", "conv", "norm", "pool", "activation", "loss",
        "stochastic", "integer_output", "integer_input")


def default_catalog_path() -> Path:
    return Path(__file__).resolve().parent / "data" / "catalog.jsonl"


class InputSpec(BaseModel):
    """One tensor input of an operator; ``shape`` entries may be ``"$k"`` (primary's dim k)."""

    model_config = ConfigDict(frozen=True)

    shape: tuple[int | str, ...] = Field(description="Shape; '$k' copies the first input's dim.")
    dtype: str = Field("float32", description="torch dtype name.")
    domain: str = Field("normal", description="normal | unit (0..1) | positive | int:HIGH")


class SeedOp(BaseModel):
    """One crawled operator and what running it showed."""

    model_config = ConfigDict(frozen=True)

    op: str = Field(description="Name used in data set rows, e.g. 'nn.Conv2d', 'torch.diag'.")
    source: Literal["torch", "transformers"] = "torch"
    kind: Literal["module", "function"] = "function"
    imports: tuple[str, ...] = Field((), description="Import lines the code needs.")
    init_code: str = Field("", description="Constructor expression (modules), a format string.")
    call_code: str = Field(description="Call expression: {mod}, {x} (first input), {in1}, ...")
    extra_init: dict[str, str] = Field(
        default_factory=dict, description="More submodules, SUFFIX -> constructor ({mod_SUFFIX}).")
    params: dict[str, Any] = Field(default_factory=dict, description="Constructor values.")
    inputs: tuple[InputSpec, ...] = Field(description="Tensor inputs; the first is chained.")
    ranks: tuple[int, ...] = Field((), description="Ranks of the first input that worked.")
    example: tuple[int, ...] = Field((), description="First input shape that was confirmed.")
    out_example: tuple[int, ...] = Field((), description="Output shape on the example.")
    out_dtype: str = Field("float32", description="Output dtype on the example.")
    rule: str = Field("", description="same | reduce | expand | reshape (output vs input).")
    tags: tuple[str, ...] = ()
    status: Literal["ok", "no_meta", "failed"] = "failed"
    error: str = Field("", description="Why it failed (last attempt).")

    @property
    def usable(self) -> bool:
        """Composable: confirmed by real runs and shape-checkable on the meta device."""
        return self.status == "ok" and "stochastic" not in self.tags

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), sort_keys=True)


def load_catalog(path: Path | None = None) -> list[SeedOp]:
    path = path or default_catalog_path()
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no catalog; run `cuda-agent synth catalog` first")
    with path.open() as handle:
        return [SeedOp.model_validate_json(line) for line in handle if line.strip()]


def write_catalog(ops: Iterable[SeedOp], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [op.to_json() for op in sorted(ops, key=lambda o: o.op)]
    path.write_text("\n".join(lines) + "\n")


def coverage(ops: list[SeedOp]) -> dict[str, Any]:
    """How many operators were found and how many work, by source and by tag."""
    by_source: dict[str, Counter] = {}
    for op in ops:
        by_source.setdefault(op.source, Counter())[op.status] += 1
    tags = Counter(tag for op in ops if op.status == "ok" for tag in op.tags)
    return {
        "found": len(ops),
        "works": sum(op.status != "failed" for op in ops),
        "composable": sum(op.usable for op in ops),
        "by_source": {k: dict(v) for k, v in sorted(by_source.items())},
        "tags": dict(sorted(tags.items())),
        "errors": dict(Counter(_error_kind(op.error) for op in ops if op.status == "failed")
                       .most_common(10)),
    }


def _error_kind(error: str) -> str:
    return error.split(":", 1)[0][:60] or "unknown"


OP_CLASSES = ("gemm", "conv", "attention", "norm", "activation", "elementwise", "reduction",
              "pool", "data_movement", "loss", "other")
"""Op classes, the units of the composer's mix and the data-set card's histogram."""
COMPUTE_HEAVY = ("gemm", "conv", "attention")
"""The classes KernelBench level 2's tasks are built around (a matrix product or a
convolution, then cheaper ops)."""
_GEMM = {"linear", "bilinear", "mm", "bmm", "matmul", "addmm", "baddbmm", "addbmm", "einsum",
         "tensordot", "inner", "outer", "ger", "kron", "dot", "vdot", "chain_matmul", "mlp",
         "intermediate"}
_ACTIVATION = {"softmax", "log_softmax", "logsoftmax", "softmin", "softmax2d", "glu",
               "threshold", "hardshrink", "softshrink", "clamp", "clamp_min", "clamp_max",
               "clip"}
_MOVEMENT = ("pad", "flip", "roll", "shuffle", "unfold", "fold", "upsample", "interpolate",
             "tril", "triu", "transpose", "repeat", "diag", "rot90", "flatten", "ravel",
             "squeeze", "adjoint", "sort", "chunk", "split", "slice", "t_copy")


def op_class(op: SeedOp) -> str:
    """The operator's class, from its name and the tags its crawl gave it by running it."""
    name = op.op.split(".")[-1]
    lower = name.lower()
    base = lower.removesuffix("_")
    if "attention" in lower or lower.endswith("decoderlayer"):
        return "attention"
    if "conv" in op.tags:
        return "conv"
    if base in _GEMM or any(lower.endswith(g) for g in ("mlp", "intermediate")):
        return "gemm"
    if "pool" in op.tags:
        return "pool"
    if "norm" in op.tags and op.rule != "reduce":
        return "norm"
    if "loss" in op.tags or lower.endswith("loss"):
        return "loss"
    if op.rule == "reduce" or "reduction" in op.tags:
        return "reduction"
    if "activation" in op.tags or base in _ACTIVATION:
        return "data_movement" if "shuffle" in lower or "rotary" in lower else "activation"
    if op.rule in ("reshape", "expand") or any(m in lower for m in _MOVEMENT):
        return "data_movement"
    if "elementwise" in op.tags:
        return "elementwise"
    return "other"
