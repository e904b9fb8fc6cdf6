"""Render a chain of bound seed operators as a readable KernelBench-format program.

Module-level size constants (the first input's dimensions and each numeric constructor
value), ``Model.__init__`` taking those values (``get_init_inputs`` returns them), a
``forward`` with one line per operator and its output shape, and ``get_inputs``.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import jinja2

from cuda_agent.synth.catalog import SeedOp

DIM_NAMES = {1: ["N"], 2: ["BATCH_SIZE", "FEATURES"], 3: ["BATCH_SIZE", "SEQ_LEN", "HIDDEN"],
             4: ["BATCH_SIZE", "CHANNELS", "HEIGHT", "WIDTH"],
             5: ["BATCH_SIZE", "CHANNELS", "DEPTH", "HEIGHT", "WIDTH"]}
ARG_NAMES = ["x", "y", "z", "u", "v", "w"]
_ENV = jinja2.Environment(loader=jinja2.PackageLoader("cuda_agent.synth", "templates"),
                          keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True)


@dataclasses.dataclass(frozen=True)
class Step:
    """One operator bound to a concrete input shape."""

    op: SeedOp
    in_shape: tuple[int, ...]
    params: dict[str, Any]
    extra_shapes: tuple[tuple[int, ...], ...]
    out_shape: tuple[int, ...]
    out_dtype: str


def _snake(name: str) -> str:
    base = name.split(".")[-1].replace("[", "_").replace("]", "")
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z][a-z])", "_", base).lower().strip("_")


def _numeric(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class _Names:
    """Unique identifiers and module-level constants."""

    def __init__(self) -> None:
        self.constants: dict[str, Any] = {}
        self.used: set[str] = set()

    def unique(self, base: str) -> str:
        name, i = base, 2
        while name in self.used:
            name, i = f"{base}_{i}", i + 1
        self.used.add(name)
        return name

    def constant(self, base: str, value: Any) -> str:
        if self.constants.get(base.upper()) == value:
            return base.upper()
        name = self.unique(base.upper())
        self.constants[name] = value
        return name


def render_task(steps: list[Step]) -> str:
    names = _Names()
    first = steps[0]
    x_dims = _dim_constants(names, first.in_shape)
    inputs = [_input_expr(first.op.inputs[0], x_dims)]
    init_args: list[tuple[str, str]] = []  # (parameter name, constant)
    modules: list[tuple[str, str]] = []  # (attribute, constructor)
    lines: list[tuple[str, str]] = []  # (statement, shape comment)
    args = ["x"]
    for step in steps:
        op = step.op
        extras = []
        for spec, shape in zip(op.inputs[1:], step.extra_shapes, strict=True):
            arg = ARG_NAMES[len(args)] if len(args) < len(ARG_NAMES) else f"in{len(args)}"
            args.append(arg)
            extras.append(arg)
            dims = [x_dims.get((i, d), str(d)) for i, d in enumerate(shape)]
            inputs.append(_input_expr(spec, dims))
        names_map = {f"in{i}": a for i, a in enumerate(extras, 1)}
        if op.kind == "module":
            attr = names.unique(_snake(op.op))
            values = {}
            for key, value in step.params.items():
                if _numeric(value):
                    bound = op.params.get(key)
                    if isinstance(bound, str) and bound.startswith("$") and step is first:
                        const = x_dims.get((int(bound[1:]) % len(step.in_shape), value))
                    else:
                        const = None
                    const = const or names.constant(key, value)
                    pname = const.lower()
                    if pname not in [a for a, _ in init_args]:
                        init_args.append((pname, const))
                    values[key] = pname
                else:
                    values[key] = repr(value)
            modules.append((attr, op.init_code.format(**values)))
            for suffix, code in op.extra_init.items():
                modules.append((f"{attr}_{suffix}", code.format(**values)))
                names_map[f"mod_{suffix}"] = f"self.{attr}_{suffix}"
            call = op.call_code.format(mod=f"self.{attr}", x="x", **names_map)
        else:
            call = op.call_code.format(x="x", **names_map,
                                       **{k: repr(v) for k, v in step.params.items()})
        lines.append((f"x = {call}", f"[{', '.join(map(str, step.out_shape))}]"))
    imports = sorted({line for s in steps for line in s.op.imports})
    return _ENV.get_template("task.py.j2").render(
        imports=imports, doc=" -> ".join(s.op.op for s in steps), init_args=init_args,
        modules=modules, lines=lines, args=args, constants=names.constants, inputs=inputs,
        x_shape=", ".join(x_dims[(i, d)] for i, d in enumerate(first.in_shape)))


def _dim_constants(names: _Names, shape: tuple[int, ...]) -> dict[tuple[int, int], str]:
    return {(i, d): names.constant(DIM_NAMES[len(shape)][i], d) for i, d in enumerate(shape)}


def _input_expr(spec: Any, dims: list[str] | dict) -> str:
    if isinstance(dims, dict):
        dims = list(dims.values())
    shape = ", ".join(dims) if dims else ""
    if spec.domain.startswith("int:"):
        return f"torch.randint(0, {spec.domain[4:]}, ({shape}{',' if len(dims) == 1 else ''}))"
    if spec.domain == "unit":
        return f"torch.rand({shape}) * 0.9 + 0.05"
    if spec.domain == "positive":
        return f"torch.rand({shape}) * 2 + 0.1"
    return f"torch.randn({shape})"
