"""Where a user's model comes from and what to feed it: ``MODULE:NAME`` paths and input specs.

An input spec describes one sample forward of the whole model::

    SAMPLE := TENSOR ((',' | ';') TENSOR)*
    TENSOR := DTYPE '[' [DIM (',' DIM)*] ']' [':' LOW '..' HIGH]

e.g. ``long[2,16]:0..1000`` (token ids drawn from [0, 1000)), ``float32[2,16,64]`` or
``long[2,16]:0..100; bool[2,16]``. Integers default to [0, 16) and bools to [0, 2); floats
are standard normal, or uniform in [LOW, HIGH) when a range is given. A spec of the form
``pkg.mod:fn`` instead names a callable returning the sample: a tensor, a tuple or list of
positional arguments, or a dict of keyword arguments.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "float": torch.float32, "fp32": torch.float32,
    "float16": torch.float16, "half": torch.float16, "fp16": torch.float16,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float64": torch.float64, "double": torch.float64,
    "int64": torch.int64, "long": torch.int64, "int32": torch.int32, "int": torch.int32,
    "int16": torch.int16, "int8": torch.int8, "uint8": torch.uint8, "bool": torch.bool,
}
_NUM = r"[-+.\deE]+"
_TENSOR = re.compile(
    rf"(?P<dtype>\w+)\[(?P<dims>[^\]]*)\](?::(?P<low>{_NUM})\.\.(?P<high>{_NUM}))?")
_GRAMMAR = "DTYPE[D0,D1,...][:LOW..HIGH], e.g. 'long[2,16]:0..1000' or 'float32[2,16,64]'"


class ExtractError(ValueError):
    """Extraction cannot go on; the message names the module, spec or value and why."""


class SpecError(ExtractError):
    """A module path or input spec is malformed or names nothing; the message says why."""


@dataclass(frozen=True)
class Sample:
    """One sample call: positional and keyword arguments, and the spec it came from."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)
    label: str = ""


def resolve(path: str) -> Any:
    """The object named by ``pkg.module:name`` (``name`` may be dotted: ``Outer.attr``)."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise SpecError(f"{path!r}: expected MODULE:NAME, e.g. 'mypkg.model:build_model'")
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as exc:
        raise SpecError(f"{path!r}: cannot import {module_name!r}: "
                        f"{type(exc).__name__}: {exc}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise SpecError(f"{path!r}: {getattr(obj, '__name__', obj)!r} has no attribute "
                            f"{part!r}")
        obj = getattr(obj, part)
    return obj


def _split(spec: str) -> list[str]:
    """Split at ',' or ';' outside brackets."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(spec):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char in ",;" and depth == 0:
            parts.append(spec[start:i])
            start = i + 1
    parts.append(spec[start:])
    return [p.strip() for p in parts if p.strip()]


def _number(text: str, where: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise SpecError(f"{where}: {text!r} is not a number") from None


def parse_tensor(text: str, generator: torch.Generator) -> torch.Tensor:
    """One ``DTYPE[dims][:LOW..HIGH]`` item as a random tensor."""
    match = _TENSOR.fullmatch(text.replace(" ", ""))
    if not match:
        raise SpecError(f"{text!r}: not a tensor spec; expected {_GRAMMAR}")
    dtype = DTYPES.get(match["dtype"].lower())
    if dtype is None:
        raise SpecError(f"{text!r}: unknown dtype {match['dtype']!r}; known: "
                        f"{', '.join(DTYPES)}")
    dims = [d for d in match["dims"].split(",") if d]
    if not all(d.isdigit() for d in dims):
        raise SpecError(f"{text!r}: dimensions must be non-negative integers")
    shape = [int(d) for d in dims]
    low = None if match["low"] is None else _number(match["low"], text)
    high = None if match["high"] is None else _number(match["high"], text)
    if low is not None and high is not None and not low < high:
        raise SpecError(f"{text!r}: empty range {match['low']}..{match['high']} (LOW < HIGH)")
    if dtype.is_floating_point:
        if low is None:
            return torch.randn(shape, generator=generator).to(dtype)
        return (torch.rand(shape, generator=generator) * (high - low) + low).to(dtype)
    if low is None:
        low, high = 0, 2 if dtype == torch.bool else 16
    if low != int(low) or high != int(high):
        raise SpecError(f"{text!r}: an integer range needs integer bounds")
    return torch.randint(int(low), int(high), shape, generator=generator).to(dtype)


def parse_spec(spec: str, seed: int = 0) -> Sample:
    """A sample from a tensor spec string or a ``pkg.mod:fn`` callable path."""
    if "[" not in spec:
        if ":" in spec:
            return call_sample(resolve(spec.strip()), spec.strip())
        raise SpecError(f"{spec!r}: expected tensor specs ({_GRAMMAR}) or a callable "
                        "'pkg.mod:fn' returning the sample")
    generator = torch.Generator().manual_seed(seed)
    items = _split(spec)
    if not items:
        raise SpecError(f"{spec!r}: no tensors; expected {_GRAMMAR}")
    return Sample(tuple(parse_tensor(item, generator) for item in items), {}, spec)


def call_sample(fn: Callable[[], Any], label: str) -> Sample:
    """Call ``fn()`` and read its result as one sample."""
    if not callable(fn):
        raise SpecError(f"{label!r}: names a {type(fn).__name__}, not a callable")
    value = fn()
    return as_sample(value, label)


def as_sample(value: Any, label: str = "") -> Sample:
    """A tensor, tuple/list (positional args), dict (keyword args) or ``Sample`` as a Sample."""
    if isinstance(value, Sample):
        return value
    if isinstance(value, torch.Tensor):
        return Sample((value,), {}, label)
    if isinstance(value, (tuple, list)):
        return Sample(tuple(value), {}, label)
    if isinstance(value, dict):
        return Sample((), dict(value), label)
    raise SpecError(f"{label or 'sample'}: a sample must be a tensor, a tuple/list of "
                    f"positional arguments or a dict of keyword arguments, not "
                    f"{type(value).__name__}")


def to_sample(value: Any, seed: int = 0) -> Sample:
    """Any accepted sample form: a spec string, a callable, or ``as_sample``'s forms."""
    if isinstance(value, str):
        return parse_spec(value, seed)
    if callable(value) and not isinstance(value, torch.Tensor):
        return call_sample(value, getattr(value, "__qualname__", repr(value)))
    return as_sample(value)
