"""Run a whole model before and after ``replace``: same outputs, and how much faster.

    from cuda_agent.integrate import check, check_model
    result = check_model(model, "blocks.*.mlp", "runs/mlp", (tokens,))   # copies the model
    result = check(model, new_model, (tokens,))                          # two models you have
    rich.print(result)

``sample_inputs`` is a tuple or list (positional arguments), a dict (keyword arguments) or
one value. Outputs may be tensors or any nesting of tuples, lists, dicts, dataclasses and
transformers ``ModelOutput``s; each tensor is compared by the judge's rule (per-dtype
atol/rtol and a relative-norm check, ``judge.compare``). Both models run under
``torch.no_grad`` in eval mode (restored after), with the same seed before each compared
call; times are medians over ``runs`` calls after ``warmup`` calls, alternating models,
with ``torch.cuda.synchronize`` around each call on a GPU.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import re
import time
from collections.abc import Callable, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from cuda_agent.integrate.replace import ReplaceReport, replace
from cuda_agent.results import TimingStats

if TYPE_CHECKING:
    from torch import nn


class CheckConfig(BaseModel):
    """How outputs are compared and calls are timed."""

    atol: float | None = Field(None, description="Absolute tolerance; default per dtype.")
    rtol: float | None = Field(None, description="Relative tolerance; default per dtype.")
    warmup: int = Field(3, description="Untimed calls of each model first.")
    runs: int = Field(10, description="Timed calls of each model (the median is reported).")
    seed: int = Field(0, description="torch.manual_seed before each compared call.")
    eval_mode: bool = Field(True, description="Run both models in eval mode (restored after).")


@dataclasses.dataclass(frozen=True)
class CheckResult:
    """Outputs compared and end-to-end times of the model before and after."""

    correct: bool
    outputs: int
    max_abs_error: float
    max_rel_error: float
    atol: float
    rtol: float
    reasons: tuple[str, ...]
    before: TimingStats
    after: TimingStats
    speedup: float
    device: str
    replaced: ReplaceReport | None = None

    def __rich__(self) -> Any:
        from rich.table import Table

        verdict = "[green]same outputs[/]" if self.correct else "[red]outputs differ[/]"
        table = Table(title=f"check on {self.device}: {verdict}", show_header=False)
        table.add_row("tensors compared", str(self.outputs))
        table.add_row("max abs / rel-norm error",
                      f"{self.max_abs_error:.3g} / {self.max_rel_error:.3g} "
                      f"(atol {self.atol:g}, rtol {self.rtol:g})")
        table.add_row("before", _ms(self.before))
        table.add_row("after", _ms(self.after))
        colour = "green" if self.speedup >= 1 else "yellow"
        table.add_row("speed-up", f"[bold {colour}]{self.speedup:.2f}x[/]")
        for reason in self.reasons:
            table.add_row("[red]problem[/]", reason)
        return table


def check_model(model: nn.Module, pattern: str, result_dir: str | Path, sample_inputs: Any, *,
                task: str | Path | None = None, config: CheckConfig | None = None
                ) -> CheckResult:
    """Deep-copy ``model``, ``replace`` ``pattern`` in the copy, and ``check`` the two."""
    new = copy.deepcopy(model)
    report = replace(new, pattern, result_dir, task=task)
    return dataclasses.replace(check(model, new, sample_inputs, config), replaced=report)


def check(original: nn.Module, new: nn.Module, sample_inputs: Any,
          config: CheckConfig | None = None) -> CheckResult:
    """Compare the two models' outputs on ``sample_inputs`` and time both."""
    import torch

    from cuda_agent.judge.compare import compare_trials
    from cuda_agent.judge.timing import stats

    config = config or CheckConfig()
    args, kwargs = _split(sample_inputs)
    cuda = any(t.is_cuda for t in _tensors([*args, *kwargs.values()], original))
    with _mode(original, new, config.eval_mode), torch.no_grad():
        torch.manual_seed(config.seed)
        expected = flatten(original(*args, **kwargs))
        torch.manual_seed(config.seed)
        got = flatten(new(*args, **kwargs))
        before, after = _time(lambda: original(*args, **kwargs),
                              lambda: new(*args, **kwargs), config, cuda)
    reasons = _structure(expected, got)
    produced = dict(got)
    pairs = [(path, e, produced[path]) for path, e in expected if path in produced]
    tensors = [(p, e, g) for p, e, g in pairs if isinstance(e, torch.Tensor)]
    reasons += [r for p, e, g in pairs if not isinstance(e, torch.Tensor)
                for r in [_other(p, e, g, config)] if r]
    result = compare_trials([[e.detach() for _, e, _ in tensors]],
                            [[g.detach() if isinstance(g, torch.Tensor) else g
                              for _, _, g in tensors]],
                            atol=config.atol, rtol=config.rtol) if tensors else None
    if result is not None:
        names = [p for p, _, _ in tensors]
        reasons += [re.sub(r"^trial 0, output (\d+)", lambda m: names[int(m.group(1))], r)
                    for r in result.reasons]
    t_before, t_after = stats(before), stats(after)
    return CheckResult(
        correct=not reasons, outputs=len(tensors),
        max_abs_error=(result.max_abs_error or 0.0) if result else 0.0,
        max_rel_error=(result.max_rel_error or 0.0) if result else 0.0,
        atol=result.atol if result else 0.0, rtol=result.rtol if result else 0.0,
        reasons=tuple(reasons), before=t_before, after=t_after,
        speedup=t_before.median_ms / t_after.median_ms if t_after.median_ms > 0 else math.inf,
        device="cuda" if cuda else "cpu")


def flatten(value: Any, path: str = "output", depth: int = 0) -> list[tuple[str, Any]]:
    """(path, leaf) pairs of a nested output: ``output.logits``, ``output[0]``, ...

    Other objects (e.g. a transformers cache) are opened by their public attributes, so the
    tensors they hold are compared too (to a depth of 8)."""
    import torch

    def inner(item: Any, where: str) -> list[tuple[str, Any]]:
        return flatten(item, where, depth + 1)

    if isinstance(value, torch.Tensor) or depth > 8:
        return [(path, value)]
    if isinstance(value, Mapping):  # dicts and transformers ModelOutput (an OrderedDict)
        return [leaf for key, item in value.items() for leaf in inner(item, f"{path}.{key}")]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [leaf for f in dataclasses.fields(value)
                for leaf in inner(getattr(value, f.name), f"{path}.{f.name}")]
    if isinstance(value, (tuple, list)):
        return [leaf for i, item in enumerate(value) for leaf in inner(item, f"{path}[{i}]")]
    fields = getattr(value, "__dict__", None)
    if isinstance(fields, dict) and not isinstance(value, (type, torch.nn.Module)) \
            and not callable(value):
        return [leaf for key, item in fields.items() if not key.startswith("_")
                for leaf in inner(item, f"{path}.{key}")]
    return [(path, value)]


def _split(sample_inputs: Any) -> tuple[list[Any], dict[str, Any]]:
    if isinstance(sample_inputs, Mapping):
        return [], dict(sample_inputs)
    if isinstance(sample_inputs, (tuple, list)):
        return list(sample_inputs), {}
    return [sample_inputs], {}


def _tensors(values: list[Any], model: nn.Module) -> list[Any]:
    return [leaf for _, leaf in flatten(values) if hasattr(leaf, "is_cuda")] + \
        [*model.parameters(), *model.buffers()]


def _structure(expected: list[tuple[str, Any]], got: list[tuple[str, Any]]) -> list[str]:
    before, after = [p for p, _ in expected], [p for p, _ in got]
    if before == after:
        return []
    return [f"output structure differs: before {_names(before)}, after {_names(after)}"]


def _names(paths: list[str]) -> str:
    return "[" + ", ".join(paths[:6]) + (", ..." if len(paths) > 6 else "") + "]"


def _other(path: str, expected: Any, got: Any, config: CheckConfig) -> str | None:
    """Compare a leaf that is not a tensor (a count, a flag, a float, None)."""
    if isinstance(expected, float) and isinstance(got, (int, float)):
        tol = (config.atol if config.atol is not None else 1e-6,
               config.rtol if config.rtol is not None else 1e-6)
        ok = math.isclose(expected, got, abs_tol=tol[0], rel_tol=tol[1])
    else:
        ok = type(expected) is type(got) and expected == got
    return None if ok else f"{path}: {got!r}, expected {expected!r}"


def _time(before: Callable[[], Any], after: Callable[[], Any], config: CheckConfig,
          cuda: bool) -> tuple[list[float], list[float]]:
    """Per-call milliseconds of both, alternating so drift in the machine hits both alike."""
    import torch

    def once(fn: Callable[[], Any]) -> float:
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        return (time.perf_counter() - start) * 1e3

    for _ in range(config.warmup):
        once(before)
        once(after)
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(max(config.runs, 1)):
        times[0].append(once(before))
        times[1].append(once(after))
    return times


@contextmanager
def _mode(original: nn.Module, new: nn.Module, eval_mode: bool):
    states = [(m, m.training) for model in (original, new) for m in model.modules()]
    if eval_mode:
        original.eval()
        new.eval()
    try:
        yield
    finally:
        for module, training in states:
            module.training = training


def _ms(timing: TimingStats) -> str:
    return f"{timing.median_ms:.4g} ms (median of {timing.runs}, min {timing.min_ms:.4g})"
