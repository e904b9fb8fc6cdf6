"""Check an extracted task against the user's module it came from.

The task is loaded like the judge loads it (``exec`` of the code, no ``__file__``), built
with ``Model(*get_init_inputs())``, given the module's state_dict (strict: the keys must be
the same) and run on every recorded input; the outputs must equal the module's. For each
shape, ``get_inputs()`` must also build tensors of the recorded shapes and dtypes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from cuda_agent.integrate.capture import CallRecorder, tensors
from cuda_agent.integrate.specs import ExtractError
from cuda_agent.tasks import TaskError, load_task
from cuda_agent.tasks.shapes import input_shapes, with_shape


@dataclass(frozen=True)
class ShapeCheck:
    """The task against the module on one recorded input shape set."""

    name: str
    shapes: tuple[tuple[int, ...], ...]
    exact: bool
    close: bool
    max_abs_diff: float
    inputs_match: bool
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and self.inputs_match and (self.exact or self.close)


def _namespace(code: str) -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": "extracted_task"}
    exec(compile(code, "model.py", "exec"), namespace)
    return namespace


def _compare(expected: Any, got: Any) -> tuple[bool, bool, float]:
    want, have = tensors(expected), tensors(got)
    if len(want) != len(have) or any(a.shape != b.shape for a, b in zip(want, have,
                                                                        strict=True)):
        return False, False, float("inf")
    exact = all(torch.equal(a, b) for a, b in zip(want, have, strict=True))
    diffs = [float((a.double() - b.double()).abs().max()) for a, b in zip(want, have,
                                                                          strict=True)
             if a.numel()]
    close = all(torch.allclose(a.double(), b.double(), rtol=1e-5, atol=1e-6)
                for a, b in zip(want, have, strict=True))
    return exact, close, max(diffs, default=0.0)


def _build(code: str, module: nn.Module, device: torch.device, where: Path) -> nn.Module:
    try:
        namespace = _namespace(code)
        torch.manual_seed(0)
        model = namespace["Model"](*namespace["get_init_inputs"]())
    except Exception as exc:
        raise ExtractError(f"{where}: Model(*get_init_inputs()) raised "
                           f"{type(exc).__name__}: {exc}") from exc
    try:
        model.load_state_dict(module.state_dict(), strict=True)
    except RuntimeError as exc:
        raise ExtractError(f"{where}: the module's state_dict does not load into Model: "
                           f"{str(exc)[:400]}") from None
    return model.to(device).eval()


def _device(module: nn.Module, recorder: CallRecorder) -> torch.device:
    found = tensors(recorder.calls[0]) + list(module.parameters())
    return found[0].device if found else torch.device("cpu")


def verify_task(path: Path, module: nn.Module, recorder: CallRecorder, notes: list[str]
                ) -> tuple[list[ShapeCheck], dict[str, dict[str, int]]]:
    """One ``ShapeCheck`` per recorded shape set, and the task's ``INPUT_SHAPES``."""
    try:
        code = load_task(path).code
        declared = input_shapes(code, str(path))
    except TaskError as exc:
        raise ExtractError(f"the written task is malformed: {exc}") from None
    device = _device(module, recorder)
    model = _build(code, module, device, path)
    names = list(declared) or ["s0"]
    checks = []
    for name, call, shapes in zip(names, recorder.calls, recorder.shapes, strict=True):
        exact = close = inputs_match = False
        diff, error = float("inf"), ""
        try:
            with torch.no_grad():
                expected = module(*call[0], **call[1])
                exact, close, diff = _compare(expected, model(*tensors(call)))
            _note_output(expected, notes)
            recorded = tensors(call)
            made = _namespace(with_shape(code, name) if declared else code)["get_inputs"]()
            inputs_match = [(tuple(t.shape), t.dtype) for t in made] == [
                (tuple(t.shape), t.dtype) for t in recorded]
            with torch.no_grad():
                model(*[t.to(device) for t in made])
        except Exception as exc:
            error = f"{type(exc).__name__}: {str(exc)[:300]}"
        checks.append(ShapeCheck(name, shapes, exact, close, diff, inputs_match, error))
    return checks, declared


def _note_output(output: Any, notes: list[str]) -> None:
    plain = isinstance(output, torch.Tensor) or (
        isinstance(output, (tuple, list)) and all(isinstance(o, torch.Tensor) for o in output))
    note = (f"forward returns a {type(output).__name__} with non-tensor parts; the judge "
            "compares a tensor or a tuple/list of tensors.")
    if not plain and note not in notes:
        notes.append(note)
