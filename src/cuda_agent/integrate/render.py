"""The KernelBench-format ``model.py`` of an extracted sub-module.

``class Model`` subclasses the user's class (so its ``state_dict`` keys are the original
module's) and is built with the recorded constructor arguments, returned by
``get_init_inputs()``. Each input dimension is a module-level constant (``X_0 = 2``);
several observed shape sets become ``INPUT_SHAPES`` (overrides of those constants).
Non-tensor forward arguments are written as constants in ``forward``.
"""

from __future__ import annotations

import keyword
import re
from dataclasses import dataclass, field
from typing import Any

import torch

from cuda_agent.integrate.capture import InitCall, tensors
from cuda_agent.integrate.literals import Renderer

RESERVED = {"torch", "nn", "Model", "get_inputs", "get_init_inputs", "INPUT_SHAPES",
            "INIT_KWARGS", "MODULE_FILE", "self"}


@dataclass(frozen=True)
class TaskPlan:
    """Everything ``render_task`` writes; built by ``extract``."""

    base: type
    summary: str
    call: tuple[tuple[Any, ...], dict[str, Any]]
    shapes: list[tuple[tuple[int, ...], ...]]
    ranges: list[tuple[float, float]]
    forward_names: tuple[str, ...]
    init: InitCall | None = None
    module_file: str | None = None
    fallback_reason: str = ""
    dtype: torch.dtype | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)


class _Names:
    def __init__(self) -> None:
        self.used = set(RESERVED)

    def new(self, hint: str) -> str:
        base = re.sub(r"\W", "_", hint) or "x"
        base = f"x{base}" if base[0].isdigit() else base
        name, n = base, 1
        while name in self.used or keyword.iskeyword(name):
            name, n = f"{base}_{n}", n + 1
        self.used.add(name)
        return name


def _substitute(value: Any, hint: str, names: _Names, leaves: list[str], r: Renderer) -> str:
    """Source for a forward argument with each tensor leaf replaced by a new input name."""
    if isinstance(value, torch.Tensor):
        leaves.append(names.new(hint))
        return leaves[-1]
    if isinstance(value, (tuple, list)):
        items = [_substitute(v, f"{hint}_{i}", names, leaves, r) for i, v in enumerate(value)]
        if isinstance(value, list):
            return f"[{', '.join(items)}]"
        return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"
    if isinstance(value, dict):
        items = [f"{r.literal(k)}: {_substitute(v, f'{hint}_{k}', names, leaves, r)}"
                 for k, v in value.items()]
        return "{" + ", ".join(items) + "}"
    return r.literal(value, f"forward argument {hint!r}")


def _make_input(t: torch.Tensor, dims: list[str], bounds: tuple[float, float]) -> str:
    shape = f"({dims[0]},)" if len(dims) == 1 else f"({', '.join(dims)})"
    if t.is_floating_point() or t.is_complex():
        return f"torch.randn({shape}, dtype={t.dtype})"
    low, high = int(bounds[0]), int(bounds[1]) + 1
    if t.dtype == torch.bool:
        return f"torch.randint({low}, {high}, {shape}).bool()"
    return f"torch.randint({low}, {high}, {shape}, dtype={t.dtype})"


def _forward(plan: TaskPlan, r: Renderer, names: _Names) -> tuple[list[str], list[str]]:
    """The ``forward`` method's lines and the input names (tensor leaves, in order)."""
    args, kwargs = plan.call
    leaves: list[str] = []
    parts = []
    for i, value in enumerate(args):
        hint = plan.forward_names[i] if i < len(plan.forward_names) else f"input{i}"
        parts.append(_substitute(value, hint, names, leaves, r))
    for key, value in kwargs.items():
        parts.append(f"{key}={_substitute(value, key, names, leaves, r)}")
    lines = [f"    def forward(self{''.join(', ' + n for n in leaves)}):",
             f"        return super().forward({', '.join(parts)})"]
    return lines, leaves


def _init(plan: TaskPlan, r: Renderer) -> tuple[list[str], list[str], list[str]]:
    """(module-level constant lines, ``__init__`` lines, ``get_init_inputs`` items)."""
    cast = [f"        self.to({plan.dtype})"] if plan.dtype is not None else []
    if plan.init is None:
        head = [f"MODULE_FILE = {plan.module_file!r}"]
        body = ["    def __init__(self):", "        nn.Module.__init__(self)",
                "        saved = torch.load(MODULE_FILE, weights_only=False)",
                "        self.__dict__.update(saved.__dict__)"]
        return head, body + cast, []
    init = plan.init
    items = [r.literal(v, f"constructor argument {i}", 1) for i, v in enumerate(init.args)]
    params = ["*args"] if init.varargs else list(init.arg_names)
    head, extra = [], ""
    if init.kwargs:
        head = [f"INIT_KWARGS = {r.literal(init.kwargs, 'constructor keyword arguments')}"]
        extra = ", **INIT_KWARGS"
    body = [f"    def __init__(self{''.join(', ' + p for p in params)}):",
            f"        super().__init__({', '.join(params)}{extra})"]
    return head, body + cast, items


def _shape_constants(plan: TaskPlan, leaves: list[str], names: _Names
                     ) -> tuple[list[str], list[list[str]]]:
    """(constant and INPUT_SHAPES lines, the constant names of each input's dimensions)."""
    dims = [[names.new(f"{leaf.upper()}_{k}") for k in range(len(shape))]
            for leaf, shape in zip(leaves, plan.shapes[0], strict=True)]
    lines = [f"{name} = {size}" for leaf_dims, shape in zip(dims, plan.shapes[0], strict=True)
             for name, size in zip(leaf_dims, shape, strict=True)]
    if len(plan.shapes) > 1:
        values = [{n: s for leaf_dims, shape in zip(dims, shapes, strict=True)
                   for n, s in zip(leaf_dims, shape, strict=True)} for shapes in plan.shapes]
        varying = [n for n in values[0] if len({v[n] for v in values}) > 1]
        entries = "".join(f"    \"s{i}\": {{{', '.join(f'{n!r}: {v[n]}' for n in varying)}}},\n"
                          for i, v in enumerate(values)).replace("'", '"')
        lines += ["", "INPUT_SHAPES = {\n" + entries + "}"]
    return lines, dims


def render_task(plan: TaskPlan) -> str:
    """The task file's source text."""
    r, names = Renderer(RESERVED), _Names()
    base = r.name_of(plan.base)
    names.used.add(base.split(".")[0])
    forward, leaves = _forward(plan, r, names)
    head, init, init_items = _init(plan, r)
    constants, dims = _shape_constants(plan, leaves, names)
    inputs = [_make_input(t, d, b)
              for t, d, b in zip(tensors(plan.call), dims, plan.ranges, strict=True)]
    notes = "".join(f"\n{note}\n" for note in plan.notes)
    doc = (f'"""{plan.summary}\n\nWritten by `cuda-agent extract`. `Model` subclasses the '
           "user's class, so its state_dict\nkeys are the original module's; weights.pt "
           f'beside this file holds the original weights.\n{notes}"""')
    sections = [doc, "import torch\nimport torch.nn as nn", "\n".join(r.imports),
                "\n".join(constants), "\n".join(head)]
    model = [f"class Model({base}):", *init, "", *forward]
    functions = ["def get_inputs():", f"    return [{', '.join(inputs)}]", "", "",
                 "def get_init_inputs():", f"    return [{', '.join(init_items)}]"]
    body = "\n\n".join(s for s in sections if s)
    return f"{body}\n\n\n" + "\n".join(model) + "\n\n\n" + "\n".join(functions) + "\n"

