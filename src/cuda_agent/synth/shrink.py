"""Shrink a task's module-level size constants so it fits a CPU audit.

KernelBench sizes target GPUs (a level-1 softmax holds 1.6 G elements). ``shrink_code``
halves integer constants assigned at module level (``batch_size = 4096``,
``input_shape = (32768,)``), batch-like names first and then the largest, until every input,
parameter and intermediate tensor of one forward pass (measured on the meta device) holds at
most ``max_numel`` elements. A halving that breaks the task is undone and that constant is
left alone. Runs inside a worker process: it executes the task's code.
"""

from __future__ import annotations

import ast
from typing import Any

MIN_BATCH = 2
MIN_SIZE = 8


def constants(code: str) -> dict[str, tuple[ast.expr, Any]]:
    """Module-level ``NAME = int``, ``NAME = 2048 * 2`` or ``NAME = (int, ...)`` assignments."""
    found = {}
    for node in ast.parse(code).body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)):
            try:
                value = _evaluate(node.value)
            except (ValueError, TypeError, ZeroDivisionError):
                continue
            if _ints(value):
                found[node.targets[0].id] = (node.value, value)
    return found


_OPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
        ast.Mult: lambda a, b: a * b, ast.FloorDiv: lambda a, b: a // b,
        ast.Pow: lambda a, b: a ** b if b < 64 else None}


def _evaluate(node: ast.expr) -> Any:
    """Integer arithmetic on literals only (no names, no calls)."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Tuple):
        return tuple(_evaluate(e) for e in node.elts)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_evaluate(node.operand)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(left, int) and isinstance(right, int):
            return _OPS[type(node.op)](left, right)
    raise ValueError("not an integer constant")


def _ints(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    return isinstance(value, tuple) and bool(value) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in value)


def rewrite(code: str, values: dict[str, Any]) -> str:
    """Replace the literal of each named module-level constant (other text untouched)."""
    lines = code.splitlines(keepends=True)
    spots = []
    for name, (node, _) in constants(code).items():
        if name in values:
            spots.append((node.lineno, node.col_offset, node.end_lineno, node.end_col_offset,
                          repr(values[name])))
    for lineno, col, end_lineno, end_col, text in sorted(spots, reverse=True):
        start, end = lineno - 1, end_lineno - 1
        head, tail = lines[start][:col], lines[end][end_col:]
        lines[start:end + 1] = [head + text + tail]
    return "".join(lines)


def measure(code: str) -> tuple[int, bool]:
    """(largest tensor of one forward on meta tensors: input, parameter or intermediate;
    whether that forward ran)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class Biggest(TorchDispatchMode):
        size = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor):
                    Biggest.size = max(Biggest.size, t.numel())
            return out

    ns: dict[str, Any] = {"__name__": "shrink_probe"}
    exec(compile(code, "<task>", "exec"), ns)
    with torch.device("meta"):
        inputs = ns["get_inputs"]()
        model = ns["Model"](*ns["get_init_inputs"]())
    sizes = [t.numel() for t in inputs if isinstance(t, torch.Tensor)]
    sizes += [p.numel() for p in model.parameters()]
    ran = True
    try:
        with torch.no_grad(), Biggest():
            model(*[t.to("meta") if isinstance(t, torch.Tensor) else t for t in inputs])
    except Exception:  # no meta kernel or data-dependent code: inputs and weights only
        ran = False
    return max([*sizes, Biggest.size, 0]), ran


def shrink_code(code: str, max_numel: int, max_steps: int = 200) -> tuple[str, dict[str, Any]]:
    """Return (shrunk code, {name: [old, new]}); the code is unchanged when it already fits."""
    values = {name: value for name, (_, value) in constants(code).items()}
    original = dict(values)
    frozen: set[str] = set()
    current = code
    size, ran = measure(current)
    for _ in range(max_steps):
        if size <= max_numel:
            break
        name = _pick(values, frozen)
        if name is None:
            break
        for trial in _trials(name, values, quarter=size > 16 * max_numel):
            candidate = rewrite(code, trial)
            try:
                new_size, new_ran = measure(candidate)
            except Exception:
                continue
            if new_ran or not ran:  # a forward that ran before must still run
                values, current, size = trial, candidate, new_size
                break
        else:
            frozen.add(name)
    changed = {k: [original[k], v] for k, v in values.items() if v != original[k]}
    return current, changed


def _trials(name: str, values: dict[str, Any], quarter: bool) -> list[dict[str, Any]]:
    """Halve ``name`` (twice when far over); then, in case sizes are tied (``batch_size`` and
    ``input_shape = (batch_size_value,)``), also every constant holding the same value."""
    one = dict(values)
    one[name] = _halve(name, values[name])
    if quarter:
        one[name] = _halve(name, one[name])
    value = values[name]
    peak = max(value) if isinstance(value, tuple) else value
    tied = dict(values)
    for other, v in values.items():
        if v in (value, peak) or isinstance(v, tuple) and peak in v:
            tied[other] = _halve(other, v)
    return [one, tied] if tied != one else [one]


def _floor(name: str) -> int:
    return MIN_BATCH if "batch" in name.lower() else MIN_SIZE


def _halve(name: str, value: Any) -> Any:
    if isinstance(value, tuple):
        big = max(range(len(value)), key=lambda i: value[i])
        return tuple(v // 2 if i == big else v for i, v in enumerate(value))
    return max(_floor(name), value // 2)


def _pick(values: dict[str, Any], frozen: set[str]) -> str | None:
    def size(name: str) -> int:
        value = values[name]
        return max(value) if isinstance(value, tuple) else value

    open_ = [n for n in values if n not in frozen and size(n) > _floor(n)
             and _halve(n, values[n]) != values[n]]
    batch = [n for n in open_ if "batch" in n.lower()]
    if batch:
        return batch[0]
    return max(open_, key=size, default=None)
