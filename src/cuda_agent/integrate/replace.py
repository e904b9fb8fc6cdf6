"""Put an optimised ``ModelNew`` back into a user's model, in place of matching sub-modules.

    from cuda_agent.integrate import replace
    report = replace(model, "blocks.*.mlp", "runs/mlp")         # an optimize OUT folder
    report = replace(model, "blocks.*.mlp", "runs/mlp/result", task="extracted/mlp/model.py")

Each match gets its own ``ModelNew(*get_init_inputs())`` (the task's init inputs), loaded
with the original sub-module's ``state_dict`` (``strict=True``; the extracted task's
``Model`` subclasses the user's class, so the keys are the same), moved to the original's
device and given each tensor's original dtype. Every replacement is built and loaded before
the model is touched: on any error the model is left as it was.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cuda_agent.integrate.load import (
    IntegrateError,
    ResultFolder,
    load_model_new,
    locate,
    task_namespace,
)

if TYPE_CHECKING:
    from torch import nn

SCALARS = (bool, int, float, str)


@dataclass(frozen=True)
class Replaced:
    """One sub-module swapped for a ``ModelNew``."""

    path: str
    original: str
    tensors: int
    device: str
    dtype: str | None


@dataclass(frozen=True)
class ReplaceReport:
    """What ``replace`` did: the result it used and every sub-module it swapped."""

    pattern: str
    result: str
    task: str
    kernels_device: str
    model_new: str
    replaced: tuple[Replaced, ...]
    seconds: float

    def __rich__(self) -> Any:
        from rich.table import Table

        table = Table(title=f"replaced {len(self.replaced)} x '{self.pattern}' with "
                      f"{self.model_new} ({self.kernels_device} kernels)")
        for column in ("sub-module", "was", "tensors loaded", "device", "dtype"):
            table.add_column(column)
        for item in self.replaced:
            table.add_row(item.path, item.original, str(item.tensors), item.device,
                          item.dtype or "-")
        return table


def replace(model: nn.Module, pattern: str, result_dir: str | Path, *,
            task: str | Path | None = None, init_inputs: Sequence[Any] | None = None,
            build: Any = None) -> ReplaceReport:
    """Swap every sub-module of ``model`` whose path matches ``pattern`` for ``ModelNew``.

    ``pattern`` is a dotted path where ``*`` matches one component (``blocks.*.mlp``;
    shell wildcards work inside a component). ``result_dir`` is an optimize OUT folder or a
    result folder (then ``task`` names the task's model.py or a task reference).
    ``init_inputs`` overrides the task's ``get_init_inputs()``; ``build`` is a BuildConfig.
    """
    start = time.perf_counter()
    paths = match(model, pattern)
    folder = locate(result_dir, task)
    model_new = load_model_new(folder, build)
    args = list(init_inputs) if init_inputs is not None else \
        list(task_namespace(folder)["get_init_inputs"]())
    new = {path: _replacement(model.get_submodule(path), path, model_new, args, folder)
           for path in paths}
    done = []
    for path, (module, record) in new.items():
        parent, _, leaf = path.rpartition(".")
        setattr(model.get_submodule(parent), leaf, module)
        done.append(record)
    return ReplaceReport(pattern, str(folder.root), folder.task, folder.device,
                         model_new.__name__, tuple(done), time.perf_counter() - start)


def match(model: nn.Module, pattern: str) -> list[str]:
    """Paths of the sub-modules that ``pattern`` names; raises if there are none."""
    parts = pattern.split(".") if pattern else []
    if not parts or any(not p for p in parts):
        raise IntegrateError(f"pattern {pattern!r}: give a dotted sub-module path such as "
                             "'blocks.*.mlp' (the whole model cannot be replaced in place)")
    from cuda_agent.integrate.capture import find_children  # imports torch

    found = [name for name, _ in find_children(model, pattern)]
    if not found:
        nearby = [name for name, _ in model.named_modules() if name][:12]
        raise IntegrateError(f"pattern {pattern!r} matches no sub-module of "
                             f"{type(model).__name__}; its sub-modules include: "
                             f"{', '.join(nearby) or '(none)'}")
    return found


def _replacement(original: nn.Module, path: str, model_new: type, args: list[Any],
                 folder: ResultFolder) -> tuple[nn.Module, Replaced]:
    state = original.state_dict()
    tensors = [*original.parameters(), *original.buffers()]
    device = tensors[0].device if tensors else None
    if device is not None and device.type != folder.device:
        raise IntegrateError(f"{path} lives on {device} but {folder.root} holds "
                             f"{folder.device} kernels")
    try:
        new = model_new(*args)
    except Exception as exc:
        raise IntegrateError(f"{path}: ModelNew(*{_short(args)}) raised "
                             f"{type(exc).__name__}: {exc}") from exc
    if device is not None:
        new = new.to(device)
    _check_keys(new, state, path, type(original).__name__)
    try:
        new.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise IntegrateError(f"{path}: the weights of {type(original).__name__} do not fit "
                             f"ModelNew(*{_short(args)}): {exc}") from None
    _match_dtypes(original, new)
    _check_attributes(original, new, path)
    new.train(original.training)
    dtype = next((str(t.dtype).removeprefix("torch.") for t in tensors
                  if t.is_floating_point()), None)
    record = Replaced(path, type(original).__name__, len(state),
                      str(device) if device is not None else "-", dtype)
    return new, record


def _check_keys(new: nn.Module, state: dict[str, Any], path: str, original: str) -> None:
    expected = set(new.state_dict())
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        raise IntegrateError(
            f"{path}: the state_dict of {original} does not match ModelNew's: "
            f"missing keys (ModelNew has, {original} lacks): {missing or 'none'}; "
            f"unexpected keys ({original} has, ModelNew lacks): {unexpected or 'none'}. "
            "Was the task extracted from this module's class?")


def _match_dtypes(original: nn.Module, new: nn.Module) -> None:
    """Give every parameter and buffer of ``new`` the dtype of the original's (mixed-dtype
    modules included); ``load_state_dict`` copies values but keeps the target's dtype."""
    source = dict(original.named_parameters())
    source.update(original.named_buffers())
    for name, tensor in [*new.named_parameters(), *new.named_buffers()]:
        old = source.get(name)
        if old is not None and old.dtype != tensor.dtype:
            tensor.data = tensor.data.to(old.dtype)
    frozen = {name for name, p in original.named_parameters() if not p.requires_grad}
    for name, param in new.named_parameters():
        if name in frozen:
            param.requires_grad_(False)


def _check_attributes(original: nn.Module, new: nn.Module, path: str) -> None:
    """Plain settings (``self.scale = 0.5``) come from the task's init inputs, not from the
    weights; refuse a replacement whose settings differ from the original's."""
    differ = [f"{key}: {value!r} here, {new.__dict__[key]!r} in ModelNew"
              for key, value in original.__dict__.items()
              if not key.startswith("_") and key != "training" and isinstance(value, SCALARS)
              and isinstance(new.__dict__.get(key), SCALARS) and new.__dict__[key] != value]
    if differ:
        raise IntegrateError(f"{path}: ModelNew built from the task's init inputs differs from "
                             f"the original in {'; '.join(differ)}; pass init_inputs= for "
                             "this module or extract a task for it")


def _short(args: list[Any]) -> str:
    text = repr(args)
    return text if len(text) <= 80 else text[:77] + "..."
