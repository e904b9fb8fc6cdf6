"""The typed task: a KernelBench-format reference program plus where it came from.

A task's ``code`` defines ``class Model(nn.Module)``, ``get_inputs()`` and
``get_init_inputs()``. ``check_source`` validates that statically (no code runs);
``cuda_agent.tasks.inspect`` runs it in a separate process to check the inputs.
"""

from __future__ import annotations

import ast
import enum
import hashlib
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class TaskError(ValueError):
    """A task file or row is malformed; the message names the file and the problem."""


class Precision(str, enum.Enum):
    """The number format a task is declared to be computed in.

    ``fp32`` forbids TF32 and lower precisions; the others allow the candidate (and the
    baselines) to compute at that precision.
    """

    FP32 = "fp32"
    TF32 = "tf32"
    BF16 = "bf16"
    FP16 = "fp16"


class Task(BaseModel):
    """One optimisation task: a reference program in KernelBench format."""

    model_config = ConfigDict(frozen=True)

    name: str = Field(description="Short identifier, e.g. '19_ReLU' or 'ops_000123'.")
    code: str = Field(description="Python source defining Model, get_inputs, get_init_inputs.")
    origin: str = Field(
        default="file",
        description="Where it came from: 'kernelbench', 'synthesized', 'file' or 'builtin'.",
    )
    level: int | None = Field(default=None, description="KernelBench level (1-4), if any.")
    problem_id: int | None = Field(default=None, description="KernelBench problem id, if any.")
    ops: tuple[str, ...] = Field(default=(), description="Operators the task fuses.")
    precision: Precision = Field(default=Precision.FP32, description="Declared precision.")
    source: str = Field(default="", description="Path (and selector) the task was read from.")
    metadata: dict[str, Any] = Field(
        default_factory=dict,
        description="Provenance only (data_source, shapes, timings); never read by the judge.",
    )

    @property
    def sha256(self) -> str:
        """Content hash of the reference code: the identity the judge and caches use."""
        return hashlib.sha256(self.code.encode()).hexdigest()

    @property
    def label(self) -> str:
        """Human-readable label with the level when known."""
        return f"L{self.level}/{self.name}" if self.level is not None else self.name


def check_source(code: str, where: str) -> ast.Module:
    """Parse task code and check that it defines the KernelBench contract.

    Raises ``TaskError`` naming ``where`` and the first problem found.
    """
    try:
        tree = ast.parse(code, filename=where)
    except SyntaxError as exc:
        raise TaskError(f"{where}:{exc.lineno}: syntax error: {exc.msg}") from None
    top = {
        node.name: node
        for node in tree.body
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
    }
    assigned = {
        target.id
        for node in tree.body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    model = top.get("Model")
    if not isinstance(model, ast.ClassDef):
        raise TaskError(f"{where}: no class `Model` defined at module level")
    if not any(isinstance(n, ast.FunctionDef) and n.name == "forward" for n in model.body):
        raise TaskError(f"{where}:{model.lineno}: class `Model` has no `forward` method")
    for fn in ("get_inputs", "get_init_inputs"):
        if fn not in top and fn not in assigned:
            raise TaskError(f"{where}: no function `{fn}()` defined at module level")
    return tree


def init_signature(code: str) -> str:
    """Return the parameter list of ``Model.__init__`` as source text (without ``self``)."""
    tree = ast.parse(code)
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Model":
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                    args = item.args
                    args.args = args.args[1:]
                    return ast.unparse(args)
    return ""
