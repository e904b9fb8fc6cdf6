"""Turn a sub-module of a user's model into a KernelBench-format task.

    from cuda_agent.integrate.extract import extract
    result = extract("mypkg.model:build_model", ["long[2,16]:0..1000"],
                     child="layers.0.mlp", out="extracted/mlp")

The factory (or class, with ``init_args``) is called while constructor arguments are
recorded; the sample forwards record the child's inputs. ``out`` receives ``model.py`` (the
task), ``weights.pt`` (the child's state_dict), ``extract.json`` (``ExtractResult``) and, when
the constructor arguments have no source form, ``module.pt`` (the whole module).
"""

from __future__ import annotations

import difflib
import inspect
import json
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from cuda_agent.integrate.capture import (
    CallRecorder,
    find_children,
    forget_constructors,
    init_call,
    record_constructors,
    run_samples,
)
from cuda_agent.integrate.literals import NotSource, Renderer, importable
from cuda_agent.integrate.render import TaskPlan, render_task
from cuda_agent.integrate.specs import ExtractError, Sample, resolve, to_sample
from cuda_agent.integrate.verify import ShapeCheck, verify_task
from cuda_agent.results import to_dict

Target = str | Callable[..., Any] | nn.Module


@dataclass(frozen=True)
class ExtractResult:
    """What ``extract`` wrote and how well the task reproduces the module (``extract.json``)."""

    out: str
    source: str
    child: str
    matched: tuple[str, ...]
    module: str
    class_path: str
    shapes: tuple[tuple[tuple[int, ...], ...], ...]
    input_shapes: dict[str, dict[str, int]]
    checks: tuple[ShapeCheck, ...]
    calls: int
    fallback: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        """The task reproduces the module on every recorded input."""
        return bool(self.checks) and all(c.ok for c in self.checks)

    @property
    def task_path(self) -> Path:
        return Path(self.out) / "model.py"


def build(target: Target, init_args: Any = None) -> nn.Module:
    """Call the factory or class ``target`` (a ``MODULE:NAME`` path or the object itself)
    with ``init_args`` (a list of positional or a dict of keyword arguments) while
    constructor arguments are recorded; a module instance is returned as it is."""
    label = target if isinstance(target, str) else getattr(target, "__qualname__", "target")
    obj = resolve(target) if isinstance(target, str) else target
    if isinstance(obj, nn.Module):
        return obj
    if not callable(obj):
        raise ExtractError(f"{label}: a {type(obj).__name__} is neither an nn.Module, a "
                           "module class nor a factory function")
    args, kwargs = ((), init_args) if isinstance(init_args, dict) else (init_args or (), {})
    try:
        with record_constructors():
            model = obj(*args, **kwargs)
    except Exception as exc:
        raise ExtractError(f"{label}: building the model raised {type(exc).__name__}: "
                           f"{exc}") from exc
    if not isinstance(model, nn.Module):
        raise ExtractError(f"{label}: returned a {type(model).__name__}, not an nn.Module")
    return model


def match_child(model: nn.Module, child: str) -> list[tuple[str, nn.Module]]:
    """The sub-modules matching ``child``; an error naming close names when none does."""
    found = find_children(model, child)
    if not found:
        names = [n for n, _ in model.named_modules() if n]
        close = difflib.get_close_matches(child, names, n=5, cutoff=0.4) or names[:8]
        raise ExtractError(f"no sub-module matches {child!r}; close names: {', '.join(close)} "
                           "('*' matches one name segment, e.g. 'layers.*.mlp')")
    return found


def _fallback_reason(module: nn.Module) -> str:
    """Why the constructor call cannot be written as source; ``""`` when it can."""
    call = init_call(module)
    if call is None:
        return "the module was not built by cuda-agent, so its constructor arguments are unknown"
    try:
        Renderer().literal(call.args, "constructor arguments")
        Renderer().literal(call.kwargs, "constructor keyword arguments")
    except NotSource as exc:
        return str(exc)
    return ""


def _forward_names(module: nn.Module) -> tuple[str, ...]:
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    try:
        params = inspect.signature(module.forward).parameters.values()
    except (TypeError, ValueError):
        return ()
    return tuple(p.name for p in params if p.kind in kinds)


def _dtype(module: nn.Module) -> torch.dtype | None:
    dtypes = {t.dtype for t in [*module.parameters(), *module.buffers()]
              if t.is_floating_point()}
    if len(dtypes) == 1 and (dtype := dtypes.pop()) != torch.get_default_dtype():
        return dtype
    return None


def _plan(module: nn.Module, recorder: CallRecorder, summary: str, out: Path,
          notes: list[str]) -> TaskPlan:
    try:
        importable(type(module))
    except NotSource as exc:
        raise ExtractError(f"{summary}: the class must be importable by the task: {exc}; "
                           "move it to a module of an installed package") from None
    reason = _fallback_reason(module)
    if reason:
        torch.save(module, out / "module.pt")
        notes.append(f"Fallback: {reason}. Model loads the whole saved module from "
                     f"{out / 'module.pt'}; keep that file.")
    return TaskPlan(base=type(module), summary=summary, call=recorder.calls[0],
                    shapes=recorder.shapes, ranges=recorder.ranges,
                    forward_names=_forward_names(module),
                    init=None if reason else init_call(module),
                    module_file=str((out / "module.pt").resolve()) if reason else None,
                    fallback_reason=reason, dtype=_dtype(module), notes=tuple(notes))


def extract(target: Target, inputs: Sequence[Any], *, out: str | Path, child: str = "",
            init_args: Any = None, seed: int = 0, device: str | None = None,
            force: bool = False) -> ExtractResult:
    """Write the task for ``child`` of the model built from ``target`` into ``out`` (an
    ``out`` that holds files already is replaced only with ``force``).

    ``inputs``: samples for the whole model, each a spec string (see ``specs``), a callable,
    a tensor, a tuple of positional or a dict of keyword arguments.
    """
    if not inputs:
        raise ExtractError("no sample inputs: give at least one (e.g. 'long[2,16]:0..1000')")
    claim_folder(Path(out), force)
    samples = [to_sample(value, seed + i) for i, value in enumerate(inputs)]
    model = build(target, init_args)
    if device is not None:
        model.to(device)
    source = target if isinstance(target, str) else getattr(target, "__qualname__",
                                                            type(target).__name__)
    try:
        return extract_module(model, samples, child, Path(out), source)
    finally:
        forget_constructors(model)


def claim_folder(out: Path, force: bool) -> None:
    """Make ``out`` empty for a new extraction: one that holds files already (an earlier
    extraction, say) is an ``ExtractError`` unless ``force``, which removes it."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        if not force:
            raise ExtractError(f"{out} exists and is not empty (use --force to replace it)")
        shutil.rmtree(out) if out.is_dir() else out.unlink()


def extract_module(model: nn.Module, samples: Sequence[Sample], child: str, out: Path,
                   source: str, force: bool = False) -> ExtractResult:
    """``extract`` for a model already built (by ``build``, so constructor calls are known)."""
    claim_folder(out, force)
    device = next((str(t.device) for t in model.parameters()), None)
    matches = match_child(model, child)
    name, module = matches[0]
    recorder = CallRecorder()
    with recorder.attached(module):
        run_samples(model, samples, device)
    if not recorder.calls:
        raise ExtractError(f"{name or 'the model'} was not called by the sample forward(s)")
    summary = f"{type(module).__name__} extracted from `{source}`" + (
        f" (child `{name}`)" if name else "")
    notes = []
    if len(matches) > 1:
        notes.append(f"{len(matches)} modules match {child!r}; inputs come from {name}.")
    if recorder.other_structures:
        notes.append(f"{recorder.other_structures} call(s) had other argument kinds, dtypes "
                     "or constants than the first and are not in this task.")
    out.mkdir(parents=True, exist_ok=True)
    plan = _plan(module, recorder, summary, out, notes)
    try:
        code = render_task(plan)
    except NotSource as exc:
        raise ExtractError(f"{name or 'module'}: {exc}; extract supports tensors, tuples, "
                           "lists and dicts of tensors, and literal constants") from None
    (out / "model.py").write_text(code)
    torch.save(module.state_dict(), out / "weights.pt")
    checks, input_shapes = verify_task(out / "model.py", module, recorder, notes)
    result = ExtractResult(
        out=str(out), source=source, child=child, matched=tuple(n for n, _ in matches),
        module=name, class_path=f"{type(module).__module__}.{type(module).__qualname__}",
        shapes=tuple(recorder.shapes), input_shapes=input_shapes, checks=tuple(checks),
        calls=recorder.total_calls, fallback=plan.fallback_reason, notes=tuple(notes))
    (out / "extract.json").write_text(json.dumps({**to_dict(result), "ok": result.ok},
                                                 indent=1, default=str))
    return result
