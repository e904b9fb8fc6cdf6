"""A task at a reduced size: its module-level size constants scaled down until a call fits.

KernelBench tasks size their inputs with module-level integer constants (``batch_size``,
``dim``, ``N = 2048 * 2``) that ``get_inputs`` and ``get_init_inputs`` read. ``size_task``
measures one call of the task - its inputs, outputs and weights in bytes, and its
floating-point operations (torch's flop counter) - on the ``meta`` device, in an interpreter
of its own, so no memory is touched however large the task. Where the call is over the
budget it halves the largest constant, measures again, and goes on until the call is within
it. A halving after which the task no longer runs on ``meta`` (a kernel larger than its
input, channels no longer divisible by the groups) or that makes the call no smaller (a
constant no size depends on) is undone and that constant left alone. Only constants whose
value is a literal or arithmetic on literals are scaled; one computed from another follows
it. ``with_sizes`` rewrites the assignments (nothing runs), so the task a judge runs at the
reduced size is the task's own code with other numbers.

    python -m cuda_agent.tasks.size_search TASK_FILE BUDGET_JSON   # prints a JSON sizing
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import json
import operator
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from cuda_agent.paths import home_dir
from cuda_agent.results import SizeChange
from cuda_agent.tasks.inspect import run_probe
from cuda_agent.tasks.task import Task, TaskError

MAX_STEPS = 400
"""Measurements a search makes at most (each a few milliseconds on ``meta``)."""


@dataclass(frozen=True)
class SizeBudget:
    """What a call of the task may take."""

    fit_bytes: int | None
    """A call's inputs, outputs and weights above this do not fit the machine (None: any)."""
    cap_bytes: int
    """A reduced call's inputs, outputs and weights at most."""
    cap_flops: float
    """A reduced call's floating-point operations at most (where they can be counted)."""
    always: bool = False
    """Reduce to the cap even when the call fits (else only when it does not)."""
    limit_bytes: int | None = None
    """Address-space limit of the measuring interpreter: a task that allocates real memory
    while being measured fails there, not in the machine."""


@dataclass(frozen=True)
class CallSize:
    """One call of a task, measured on ``meta``."""

    bytes: int
    """Inputs, outputs (inputs again where the outputs cannot be measured) and weights."""
    flops: int | None
    """Floating-point operations torch's flop counter sees (None: not counted)."""
    ran: bool = True
    """Whether ``forward`` ran on ``meta`` (else the outputs are taken as large as the
    inputs: an operator without a meta kernel)."""


@dataclass(frozen=True)
class Sizing:
    """The size a task is judged at: its own (no ``changes``) or a reduced one."""

    full: CallSize
    judged: CallSize
    changes: tuple[SizeChange, ...]
    reached: bool
    """Whether the judged call is within the budget's target."""

    @property
    def reduced(self) -> bool:
        return bool(self.changes)

    def describe(self) -> str:
        """``batch_size 4096->16, dim 393216->4096``."""
        return ", ".join(f"{c.name} {c.full}->{c.judged}" for c in self.changes)


def human_bytes(count: int) -> str:
    """``12.00 GiB``, ``192.0 MiB``."""
    if count >= 2**30:
        return f"{count / 2**30:.2f} GiB"
    return f"{count / 2**20:.1f} MiB"


def scalable_constants(code: str) -> dict[str, int]:
    """Module-level ``NAME = <integer literal or arithmetic on literals>`` of at least 2."""
    found: dict[str, int] = {}
    for node in ast.parse(code).body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)):
            value = _literal_int(node.value)
            if value is not None and value >= 2:
                found[node.targets[0].id] = value
    return found


def with_sizes(code: str, sizes: dict[str, int]) -> str:
    """``code`` with each named module-level constant assigned its new value."""
    tree = ast.parse(code)
    left = dict(sizes)
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name) and node.targets[0].id in left):
            value = left.pop(node.targets[0].id)
            node.value = ast.copy_location(ast.Constant(int(value)), node.value)
    if left:
        raise TaskError(f"no module-level constant {', '.join(left)} in the task")
    return ast.unparse(tree) + "\n"


def reduced_task(task: Task, sizing: Sizing) -> Task:
    """``task`` at the size ``sizing`` judges it at (``task`` itself when not reduced)."""
    if not sizing.reduced:
        return task
    code = with_sizes(task.code, {c.name: c.judged for c in sizing.changes})
    return task.model_copy(update={"code": f"# reduced size: {sizing.describe()}\n{code}"})


_SIZINGS: dict[str, Sizing] = {}


def size_task(task: Task, budget: SizeBudget, timeout_s: float = 120.0) -> Sizing:
    """The size to judge ``task`` at within ``budget``: measured in an interpreter of its
    own, kept for this process and in ``$CUDA_AGENT_HOME/sizes`` (keyed by the task's code,
    the budget, torch's version and the search's own code). Raises ``TaskError`` when the
    task cannot be measured at all."""
    import torch

    key = hashlib.sha256(json.dumps([_search_code(), torch.__version__, task.sha256,
                                     asdict(budget)], sort_keys=True).encode()).hexdigest()
    if key in _SIZINGS:
        return _SIZINGS[key]
    path = home_dir() / "sizes" / f"{key}.json"
    try:
        sizing = _decode(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        sizing = _decode(_probe(task, budget, timeout_s))
        with contextlib.suppress(OSError):  # a folder that cannot be written keeps nothing
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(asdict(sizing)))
            tmp.replace(path)
    _SIZINGS[key] = sizing
    return sizing


def _search_code() -> str:
    """The digest of this module and the search's: a changed search measures again."""
    here = Path(__file__).resolve()
    digest = hashlib.sha256(here.read_bytes())
    digest.update(here.with_name("size_search.py").read_bytes())
    return digest.hexdigest()


def _probe(task: Task, budget: SizeBudget, timeout_s: float) -> dict:
    return run_probe(task, "cuda_agent.tasks.size_search", (json.dumps(asdict(budget)),),
                     "measuring the task's size", "measuring the task's size", timeout_s)


def _decode(data: dict) -> Sizing:
    return Sizing(full=CallSize(**data["full"]), judged=CallSize(**data["judged"]),
                  changes=tuple(SizeChange(**c) for c in data["changes"]),
                  reached=bool(data["reached"]))


_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
              ast.FloorDiv: operator.floordiv, ast.Pow: operator.pow,
              ast.LShift: operator.lshift, ast.RShift: operator.rshift}


def _literal_int(node: ast.expr) -> int | None:
    """The value of an integer literal or of arithmetic on them; None for anything else."""
    if isinstance(node, ast.Constant):
        return node.value if type(node.value) is int else None
    if not isinstance(node, ast.BinOp) or type(node.op) not in _OPERATORS:
        return None
    left, right = _literal_int(node.left), _literal_int(node.right)
    if left is None or right is None or (isinstance(node.op, ast.FloorDiv) and right == 0):
        return None
    if isinstance(node.op, (ast.Pow, ast.LShift, ast.RShift)) and not 0 <= right <= 64:
        return None
    return _OPERATORS[type(node.op)](left, right)
