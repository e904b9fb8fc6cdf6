"""Run one task and measure what the filters need (inside a worker process).

``probe_task`` executes the task's code, so it runs in ``cuda_agent.synth.worker``; it
returns plain JSON: per-check pass/fail with a reason, metrics, shapes and times. The
checks that compare tensors use the ``FilterConfig`` thresholds passed in.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from cuda_agent.synth.config import FilterConfig
from cuda_agent.synth.shrink import shrink_code
from cuda_agent.synth.trace import trace_redundancy
from cuda_agent.tasks.degenerate import Degeneracy

RUN_CHECKS = ("builds", "runs_eager", "runs_compiled", "deterministic", "no_stochastic_ops",
              "finite", "not_constant", "not_near_zero", "not_identity", "not_degenerate",
              "sensitive_to_inputs", "no_redundant_ops", "runtime_window")
MODEL_SEED, RNG_SEED = 1234, 4321
SCALED_SEED = 500
"""Scaled draws use seeds from ``seed + SCALED_SEED`` on, as the judge's scaled trials."""


class _Report:
    def __init__(self) -> None:
        self.checks: dict[str, bool] = {}
        self.reasons: list[str] = []
        self.metrics: dict[str, Any] = {}

    def set(self, name: str, ok: bool, why: str = "") -> bool:
        self.checks[name] = ok
        if not ok:
            self.reasons.append(f"{name}: {why}")
        return ok


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _outputs(out: Any) -> list[torch.Tensor]:
    tensors = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
    if not tensors:
        raise TypeError(f"forward returned {type(out).__name__}, no tensor")
    return tensors


def _within(a: list[torch.Tensor], b: list[torch.Tensor], atol: float, rtol: float) -> bool:
    """Every element of ``a`` matches ``b`` within atol + rtol*|b| (a trivial answer passes)."""
    if len(a) != len(b) or any(x.shape != y.shape for x, y in zip(a, b, strict=True)):
        return False
    return all(torch.allclose(x.double(), y.double(), atol=atol, rtol=rtol, equal_nan=False)
               for x, y in zip(a, b, strict=True))


def _max_rel(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    diff = max(float((x.double() - y.double()).abs().max()) if x.numel() else 0.0
               for x, y in zip(a, b, strict=True))
    scale = max(float(y.double().abs().max()) if y.numel() else 0.0 for y in b)
    return diff / scale if scale else diff


class Task:
    """The task's namespace plus seeded construction of its model and inputs."""

    def __init__(self, code: str, device: str):
        self.ns: dict[str, Any] = {"__name__": "synth_task"}
        exec(compile(code, "<task>", "exec"), self.ns)
        self.device = device
        self.init = list(self.ns["get_init_inputs"]())

    def model(self) -> torch.nn.Module:
        torch.manual_seed(MODEL_SEED)
        return self.ns["Model"](*self.init).to(self.device)

    def inputs(self, seed: int, scale: float = 1.0) -> list[Any]:
        """The inputs drawn with ``seed``, floating ones multiplied by ``scale``."""
        torch.manual_seed(seed)
        out = [t.to(self.device) if isinstance(t, torch.Tensor) else t
               for t in self.ns["get_inputs"]()]
        if scale != 1.0:
            out = [t * scale if isinstance(t, torch.Tensor) and t.is_floating_point() else t
                   for t in out]
        return out

    def run(self, model: torch.nn.Module, inputs: list[Any], rng: int = RNG_SEED
            ) -> list[torch.Tensor]:
        torch.manual_seed(rng)
        with torch.no_grad():
            out = _outputs(model(*inputs))
        _sync(self.device)
        return out


def probe_task(code: str, device: str, filters: FilterConfig, seed: int = 0) -> dict[str, Any]:
    report = _Report()
    result: dict[str, Any] = {"code": None}
    if filters.max_numel:
        try:
            shrunk, changed = shrink_code(code, filters.max_numel)
        except Exception as exc:
            shrunk, changed = code, {"error": f"{type(exc).__name__}: {exc}"}
        if changed:
            result["code"], code = shrunk, shrunk
            report.metrics["shrunk"] = changed
    try:
        task = Task(code, device)
        model = task.model()
        in1 = task.inputs(seed)
    except Exception as exc:
        report.set("builds", False, f"{type(exc).__name__}: {str(exc)[:300]}")
        return _finish(result, report)
    report.set("builds", True)
    try:
        out1 = task.run(model, in1)
    except Exception as exc:
        report.set("runs_eager", False, f"{type(exc).__name__}: {str(exc)[:300]}")
        return _finish(result, report)
    report.set("runs_eager", True)
    result["input_shapes"] = [list(t.shape) for t in in1 if isinstance(t, torch.Tensor)]
    result["output_shapes"] = [list(t.shape) for t in out1]
    try:
        _value_checks(task, model, in1, out1, filters, seed, report)
        _timing(task, model, in1, out1, filters, report, result)
    except Exception as exc:  # a later run failed where the first one worked
        report.set("runs_eager", False, f"{type(exc).__name__}: {str(exc)[:300]}")
    return _finish(result, report)


def _finish(result: dict[str, Any], report: _Report) -> dict[str, Any]:
    for name in RUN_CHECKS:
        if name not in report.checks:
            report.checks[name] = False  # not reached: an earlier check failed
    result.update(checks=report.checks, reasons=report.reasons, metrics=report.metrics)
    return result


def _value_checks(task: Task, model, in1, out1, f: FilterConfig, seed: int, report: _Report
                  ) -> None:
    fresh = task.model()
    again = task.run(fresh, task.inputs(seed))
    rel = _max_rel(again, out1)
    report.metrics["determinism_rel"] = rel
    report.set("deterministic", rel <= f.determinism_tol,
               f"two runs with the same seeds differ (max relative difference {rel:.3g})")
    other_rng = task.run(fresh, task.inputs(seed), rng=RNG_SEED + 1)
    report.set("no_stochastic_ops", _max_rel(other_rng, again) <= f.determinism_tol,
               "the output depends on the random-number state (a stochastic operator)")
    finite = all(bool(torch.isfinite(t).all()) for t in out1 if t.is_floating_point())
    report.set("finite", finite, "the output holds NaN or Inf")
    in2 = task.inputs(seed + 1)
    out2 = task.run(model, in2)
    report.metrics["draw_change_rel"] = _max_rel(out2, out1) if len(out2) == len(out1) else None
    report.set("not_constant", not _within(out2, out1, f.trivial_atol, f.trivial_rtol),
               f"outputs for two different input draws agree within atol={f.trivial_atol:g}, "
               f"rtol={f.trivial_rtol:g} (a fixed answer would pass)")
    peak = max(float(t.double().abs().max()) if t.numel() else 0.0 for t in out1)
    report.metrics["max_abs_output"] = peak
    zero_ok = peak > f.trivial_atol / (1 - f.trivial_rtol)
    report.set("not_near_zero", zero_ok, f"max |output| is {peak:.3g}: an all-zero output "
               f"passes at atol={f.trivial_atol:g}")
    same = [i for i, t in enumerate(in1) if isinstance(t, torch.Tensor)
            and any(_within([o], [t], f.trivial_atol, f.trivial_rtol) for o in out1)]
    report.set("not_identity", not same, f"the output equals input {same[:1]} within "
               f"atol={f.trivial_atol:g}, rtol={f.trivial_rtol:g}")
    degenerate = _degenerate(task, model, out1, f, seed, report)
    report.set("not_degenerate", degenerate is None, degenerate or "")
    in3 = task.inputs(seed + 2)
    dull = []
    for i, t in enumerate(in1):
        if not isinstance(t, torch.Tensor) or torch.equal(t, in3[i]):
            continue  # a fixed input (a mask, a constant): nothing to be sensitive to
        swapped = list(in1)
        swapped[i] = in3[i]
        if _within(task.run(model, swapped), out1, f.trivial_atol, f.trivial_rtol):
            dull.append(i)
    report.set("sensitive_to_inputs", not dull, f"redrawing input(s) {dull} leaves the output "
               f"unchanged within atol={f.trivial_atol:g}, rtol={f.trivial_rtol:g}")
    if f.redundant_ops:
        torch.manual_seed(RNG_SEED)
        found = trace_redundancy(model, in1, f.identity_atol, f.identity_rtol)
        report.metrics["redundant_ops"] = found
        report.set("no_redundant_ops", not found, "; ".join(found[:4]))
    else:
        report.set("no_redundant_ops", True)


def _degenerate(task: Task, model, out1: list[torch.Tensor], f: FilterConfig, seed: int,
                report: _Report) -> str | None:
    """Whether a trivial answer passes the judge's comparison at every trial: the draws
    ``seed`` (its outputs ``out1``), ``seed + 1``, ..., then draws with floating inputs
    scaled. Each answer is compared with inputs drawn afresh, as a forward may write into
    its own. Stops once no answer is left."""
    check = Degeneracy(f.degenerate_atol, f.degenerate_rtol)
    check.add(out1, task.inputs(seed))
    plan = [(seed + i, 1.0) for i in range(1, f.degenerate_trials)]
    plan += [(seed + SCALED_SEED + j, s) for j, s in enumerate(f.degenerate_scales)]
    for draw, scale in plan:
        if not check.open:
            break
        outputs = task.run(model, task.inputs(draw, scale))
        check.add(outputs, task.inputs(draw, scale))
    report.metrics["degenerate_trials"] = check.trials
    return check.reason()


def _time(fn, device: str, runs: int) -> float:
    times = []
    for _ in range(runs):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def _timing(task: Task, model, in1, out1, f: FilterConfig, report: _Report,
            result: dict[str, Any]) -> None:
    def eager() -> None:
        with torch.no_grad():
            model(*in1)

    eager()
    ms = _time(eager, task.device, f.timing_runs)
    result["eager_ms"] = ms
    lo, hi = f.window_ms(task.device)
    if not report.set("runtime_window", lo <= ms <= hi,
                      f"eager runtime {ms:.3g} ms is outside [{lo:g}, {hi:g}] ms on "
                      f"{task.device}"):
        report.metrics["compile"] = "not reached (runtime outside the window)"
        return
    if not f.compile_check:
        report.set("runs_compiled", True)
        report.metrics["compile"] = "skipped"
        return
    from torch import _dynamo

    _dynamo.reset()
    try:
        compiled = torch.compile(model)
        start = time.perf_counter()
        outc = task.run(compiled, in1)
        report.metrics["compile_s"] = time.perf_counter() - start
    except Exception as exc:
        report.set("runs_compiled", False, f"torch.compile failed: {type(exc).__name__}: "
                   f"{str(exc).splitlines()[0][:300] if str(exc) else ''}")
        return
    if not _within(outc, out1, f.compile_atol, f.compile_rtol):
        report.set("runs_compiled", False, "torch.compile output differs from eager "
                   f"(max relative difference {_max_rel(outc, out1):.3g})")
        return
    report.set("runs_compiled", True)

    def run_compiled() -> None:
        with torch.no_grad():
            compiled(*in1)

    result["compile_ms"] = _time(run_compiled, task.device, f.timing_runs)
    _dynamo.reset()
