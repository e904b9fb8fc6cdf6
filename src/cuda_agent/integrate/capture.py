"""Watch a user's model being built and run: constructor arguments and forward inputs.

``record_constructors()`` notes, while a factory builds a model, the arguments each
``nn.Module`` was constructed with (the outermost ``__init__`` call per instance, defaults
filled in). It uses a profile hook rather than patching classes, because the target's class
is only known once the model exists; the record lives in the instance's ``__dict__`` so
``copy.deepcopy`` clones (``_get_clones``-style layer stacks) carry it too.
``CallRecorder`` records the inputs of every forward call of one module.
"""

from __future__ import annotations

import contextlib
import fnmatch
import inspect
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from cuda_agent.integrate.specs import ExtractError, Sample

_ATTR = "_cuda_agent_init"


@dataclass(frozen=True)
class InitCall:
    """How a module was constructed: ``type(module)(*args, **kwargs)``; names of ``args``."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    arg_names: tuple[str, ...]
    varargs: bool = False


def _frame_call(frame: Any) -> InitCall:
    code, local = frame.f_code, frame.f_locals
    names, npos, nkw = code.co_varnames, code.co_argcount, code.co_kwonlyargcount
    arg_names = names[1:npos]
    args = [local[n] for n in arg_names]
    kwargs = {n: local[n] for n in names[npos:npos + nkw]}
    index, varargs = npos + nkw, False
    if code.co_flags & inspect.CO_VARARGS:
        args.extend(local[names[index]])
        varargs, index = True, index + 1
    if code.co_flags & inspect.CO_VARKEYWORDS:
        kwargs.update(local[names[index]])
    return InitCall(tuple(args), kwargs, tuple(arg_names), varargs)


@contextlib.contextmanager
def record_constructors() -> Iterator[None]:
    """While active, every new ``nn.Module`` remembers its constructor call (see ``init_call``)."""
    previous = sys.getprofile()

    def hook(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_name == "__init__" and frame.f_code.co_argcount:
            obj = frame.f_locals.get(frame.f_code.co_varnames[0])
            if isinstance(obj, nn.Module) and _ATTR not in vars(obj):
                vars(obj)[_ATTR] = _frame_call(frame)
        if previous is not None:
            previous(frame, event, arg)

    sys.setprofile(hook)
    try:
        yield
    finally:
        sys.setprofile(previous)


def init_call(module: nn.Module) -> InitCall | None:
    """The recorded constructor call of ``module``, if it was built under the recorder."""
    return vars(module).get(_ATTR)


def forget_constructors(root: nn.Module) -> None:
    """Drop the records from ``root`` and its sub-modules (they hold references)."""
    for module in root.modules():
        vars(module).pop(_ATTR, None)


def find_children(root: nn.Module, pattern: str) -> list[tuple[str, nn.Module]]:
    """Sub-modules whose dotted name matches ``pattern``; ``*`` matches one name segment.

    ``""`` is the root itself. Names follow ``root.named_modules()`` (``layers.0.mlp``).
    """
    if not pattern:
        return [("", root)]
    parts = pattern.split(".")
    found = []
    for name, module in root.named_modules():
        segments = name.split(".") if name else []
        if len(segments) == len(parts) and all(
                fnmatch.fnmatchcase(s, p) for s, p in zip(segments, parts, strict=True)):
            found.append((name, module))
    return found


def group_name(name: str) -> str:
    """``layers.3.mlp`` -> ``layers.*.mlp``: repeated structures under one pattern."""
    return ".".join("*" if part.isdigit() else part for part in name.split("."))


def structure(value: Any) -> Any:
    """A hashable description of a call's arguments with tensors as (dtype, rank)."""
    if isinstance(value, torch.Tensor):
        return ("tensor", str(value.dtype), value.dim())
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(structure(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((k, structure(v)) for k, v in value.items()))
    return ("value", repr(value))


def tensors(value: Any) -> list[torch.Tensor]:
    """The tensor leaves of nested tuples, lists and dicts, in order."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in tensors(v)]
    return []


def _clone(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, (tuple, list)):
        items = [_clone(v) for v in value]
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, dict):
        return {k: _clone(v) for k, v in value.items()}
    return value


@dataclass
class CallRecorder:
    """Forward inputs of one module: the first call of each distinct shape set.

    Calls whose structure (argument kinds, dtypes, ranks, constants) differs from the first
    call's cannot share one task; they are counted in ``other_structures``.
    """

    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = field(default_factory=list)
    shapes: list[tuple[tuple[int, ...], ...]] = field(default_factory=list)
    ranges: list[tuple[float, float]] = field(default_factory=list)
    other_structures: int = 0
    total_calls: int = 0
    _structure: Any = None

    def __call__(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.total_calls += 1
        key = structure((args, kwargs))
        if self._structure is None:
            self._structure = key
        elif key != self._structure:
            self.other_structures += 1
            return
        leaves = tensors((args, kwargs))
        shape = tuple(tuple(t.shape) for t in leaves)
        bounds = [_bounds(t) for t in leaves]
        self.ranges = bounds if not self.ranges else [
            (min(a[0], b[0]), max(a[1], b[1])) for a, b in zip(self.ranges, bounds, strict=True)]
        if shape not in self.shapes:
            self.shapes.append(shape)
            self.calls.append((_clone(args), _clone(kwargs)))

    @contextlib.contextmanager
    def attached(self, module: nn.Module) -> Iterator[CallRecorder]:
        handle = module.register_forward_pre_hook(self, with_kwargs=True)
        try:
            yield self
        finally:
            handle.remove()


def _bounds(t: torch.Tensor) -> tuple[float, float]:
    if t.numel() == 0 or t.is_floating_point() or t.is_complex():
        return (0.0, 0.0)
    return (float(t.min()), float(t.max()))


def run_samples(model: nn.Module, samples: Sequence[Sample], device: str | None = None
                ) -> None:
    """Run the whole model on each sample, in eval mode and without gradients."""
    model.eval()
    for sample in samples:
        args, kwargs = _to(sample.args, device), _to(sample.kwargs, device)
        try:
            with torch.no_grad():
                model(*args, **kwargs)
        except Exception as exc:
            raise ExtractError(f"the sample forward ({sample.label or 'sample'}) raised "
                               f"{type(exc).__name__}: {exc}") from exc


def _to(value: Any, device: str | None) -> Any:
    if device is None:
        return value
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (tuple, list)):
        return type(value)(_to(v, device) for v in value)
    if isinstance(value, dict):
        return {k: _to(v, device) for k, v in value.items()}
    return value
