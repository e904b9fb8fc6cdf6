"""Run one task and measure what the filters need (inside a worker process).

``probe_task`` executes the task's code, so it runs in ``cuda_agent.synth.worker``; it
returns plain JSON: per-check pass/fail with a reason, metrics, shapes and times. The
checks that compare tensors use the ``FilterConfig`` thresholds passed in.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from cuda_agent.synth.config import FilterConfig
from cuda_agent.synth.measure import Report, constant_share, max_rel, score
from cuda_agent.synth.shrink import shrink_code
from cuda_agent.synth.trace import trace_redundancy, unchanged_statements
from cuda_agent.tasks.degenerate import Degeneracy

RUN_CHECKS = ("builds", "runs_eager", "runs_compiled", "deterministic", "no_stochastic_ops",
              "finite", "not_constant", "not_near_zero", "not_identity", "not_degenerate",
              "not_mostly_constant", "sensitive_to_inputs", "no_redundant_ops",
              "runtime_window")
MODEL_SEED, RNG_SEED = 1234, 4321
SCALED_SEED = 500
"""Scaled draws use seeds from ``seed + SCALED_SEED`` on, as the judge's scaled trials."""


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _outputs(out: Any) -> list[torch.Tensor]:
    tensors = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
    if not tensors:
        raise TypeError(f"forward returned {type(out).__name__}, no tensor")
    return tensors


class Task:
    """The task's namespace plus seeded construction of its model and inputs."""

    def __init__(self, code: str, device: str):
        import linecache

        self.ns: dict[str, Any] = {"__name__": "synth_task"}
        # its lines, for findings that quote a statement
        linecache.cache["<task>"] = (len(code), None, code.splitlines(True), "<task>")
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
    report = Report()
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


def _finish(result: dict[str, Any], report: Report) -> dict[str, Any]:
    for name in RUN_CHECKS:
        if name not in report.checks:
            report.checks[name] = False  # not reached: an earlier check failed
    result.update(checks=report.checks, reasons=report.reasons, metrics=report.metrics)
    return result


def _value_checks(task: Task, model, in1, out1, f: FilterConfig, seed: int, report: Report
                  ) -> None:
    fresh = task.model()
    again = task.run(fresh, task.inputs(seed))
    rel = max_rel(again, out1)
    report.metrics["determinism_rel"] = rel
    report.set("deterministic", rel <= f.determinism_tol,
               f"two runs with the same seeds differ (max relative difference {rel:.3g})")
    other_rng = task.run(fresh, task.inputs(seed), rng=RNG_SEED + 1)
    report.set("no_stochastic_ops", max_rel(other_rng, again) <= f.determinism_tol,
               "the output depends on the random-number state (a stochastic operator)")
    finite = all(bool(torch.isfinite(t).all()) for t in out1 if t.is_floating_point())
    report.set("finite", finite, "the output holds NaN or Inf")
    tol = f"atol={f.trivial_atol:g}, rtol={f.trivial_rtol:g}"
    band = f"within {f.borderline_factor:g}x of that tolerance"

    def trivial(name: str, value: float, why: str) -> None:
        """A trivial answer fails at ``value`` > 1 (its error over the tolerance)."""
        report.metrics[f"{name}_score"] = round(value, 4) if math.isfinite(value) else None
        report.judge(name, value > 1, value <= f.borderline_factor, why, band)

    out2 = task.run(model, task.inputs(seed + 1))
    report.metrics["draw_change_rel"] = max_rel(out2, out1) if len(out2) == len(out1) else None
    trivial("not_constant", score(out2, out1, f.trivial_atol, f.trivial_rtol),
            f"outputs for two different input draws agree within {tol} (a fixed answer "
            "would pass)")
    peak = max(float(t.double().abs().max()) if t.numel() else 0.0 for t in out1)
    report.metrics["max_abs_output"] = peak
    trivial("not_near_zero", peak / (f.trivial_atol / (1 - f.trivial_rtol)),
            f"max |output| is {peak:.3g}: an all-zero output passes at atol={f.trivial_atol:g}")
    same = [(min(score([o], [t], f.trivial_atol, f.trivial_rtol) for o in out1), i)
            for i, t in enumerate(in1) if isinstance(t, torch.Tensor)]
    closest = min(same, default=(math.inf, None))
    trivial("not_identity", closest[0], f"the output equals input {closest[1]} within {tol}")
    _degenerate(task, model, out1, f, seed, report)
    _constant_share(out1, f, report)
    in3 = task.inputs(seed + 2)
    dull = []
    for i, t in enumerate(in1):
        if not isinstance(t, torch.Tensor) or torch.equal(t, in3[i]):
            continue  # a fixed input (a mask, a constant): nothing to be sensitive to
        swapped = list(in1)
        swapped[i] = in3[i]
        dull.append((score(task.run(model, swapped), out1, f.trivial_atol, f.trivial_rtol), i))
    least = min(dull, default=(math.inf, None))
    trivial("sensitive_to_inputs", least[0], f"redrawing input {least[1]} leaves the output "
            f"unchanged within {tol}")
    if f.redundant_ops:
        torch.manual_seed(RNG_SEED)
        found = trace_redundancy(model, task.inputs(seed), f.identity_atol, f.identity_rtol)
        found += unchanged_statements(model, task.inputs(seed))
        report.metrics["redundant_ops"] = found
        report.set("no_redundant_ops", not found, "; ".join(found[:4]))
    else:
        report.set("no_redundant_ops", True)


def _degenerate(task: Task, model, out1: list[torch.Tensor], f: FilterConfig, seed: int,
                report: Report) -> None:
    """Whether a trivial answer passes the judge's comparison at every trial: the draws
    ``seed`` (its outputs ``out1``), ``seed + 1``, ..., then draws with floating inputs
    scaled (``not_degenerate``); borderline where one passes every trial within
    ``borderline_factor`` times the trivial (KernelBench) tolerance. Each answer is
    compared with inputs drawn afresh, as a forward may write into its own. Stops once no
    answer is left."""
    strict = Degeneracy(f.degenerate_atol, f.degenerate_rtol)
    loose = Degeneracy(f.trivial_atol * f.borderline_factor,
                       f.trivial_rtol * f.borderline_factor)
    plan = [(seed, 1.0)] + [(seed + i, 1.0) for i in range(1, f.degenerate_trials)]
    plan += [(seed + SCALED_SEED + j, s) for j, s in enumerate(f.degenerate_scales)]
    for k, (draw, scale) in enumerate(plan):
        if not (strict.open or loose.open):
            break
        outputs = out1 if k == 0 else task.run(model, task.inputs(draw, scale))
        for check in (strict, loose):
            if check.open:
                check.add(outputs, task.inputs(draw, scale))
    report.metrics["degenerate_trials"] = strict.trials
    near = loose.reason()
    report.judge("not_degenerate", strict.reason() is None, near is not None,
                 strict.reason() or (near or "").removeprefix("degenerate task: "),
                 f"at {f.borderline_factor:g}x the trivial tolerance (atol={f.trivial_atol:g},"
                 f" rtol={f.trivial_rtol:g})")


def _constant_share(out1: list[torch.Tensor], f: FilterConfig, report: Report) -> None:
    """An output that is almost all one value (mostly zeros): a constant answer passes
    nearly every element, so the task is nearly trivial even where it is not degenerate."""
    shares = [constant_share(t, f.trivial_atol, f.trivial_rtol)
              for t in out1 if t.is_floating_point()]
    share = max(shares, default=0.0)
    report.metrics["constant_share"] = round(share, 4)
    limit, low = f.max_constant_share, f.max_constant_share - f.constant_share_margin
    report.judge("not_mostly_constant", share < limit, share >= low,
                 f"one constant passes {share:.1%} of the output's elements at "
                 f"atol={f.trivial_atol:g}, rtol={f.trivial_rtol:g} (limit {limit:.0%})",
                 f"at or above {low:.0%}")


def _time(fn, device: str, runs: int) -> float:
    """The median time of ``fn`` in ms: wall time on a GPU; on the CPU the process's CPU
    time per torch thread, which other processes on the machine barely change (they
    stretch the wall time several-fold), so the runtime window's verdict is the same on a
    busy machine as on a quiet one."""
    cpu = not device.startswith("cuda")
    clock = time.process_time if cpu else time.perf_counter
    share = torch.get_num_threads() if cpu else 1
    times = []
    for _ in range(runs):
        _sync(device)
        start = clock()
        fn()
        _sync(device)
        times.append((clock() - start) * 1e3 / share)
    return statistics.median(times)


def _timing(task: Task, model, in1, out1, f: FilterConfig, report: Report,
            result: dict[str, Any]) -> None:
    def eager() -> None:
        with torch.no_grad():
            model(*in1)

    eager()
    ms = _time(eager, task.device, f.timing_runs)
    result["eager_ms"] = ms
    lo, hi = f.window_ms(task.device)
    margin = f.borderline_time_factor
    if not report.judge("runtime_window", lo <= ms <= hi, not lo * margin <= ms <= hi / margin,
                        f"eager runtime {ms:.3g} ms is outside [{lo:g}, {hi:g}] ms on "
                        f"{task.device}" if not lo <= ms <= hi else
                        f"eager runtime {ms:.3g} ms is within {margin:g}x of the window "
                        f"[{lo:g}, {hi:g}] ms on {task.device}", "a busier machine could "
                        "move it out"):
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
    drift = score(outc, out1, f.compile_atol, f.compile_rtol)
    report.metrics["compile_score"] = round(drift, 4) if math.isfinite(drift) else None
    if not report.judge("runs_compiled", drift <= 1, drift > 1 / f.borderline_factor,
                        "torch.compile output differs from eager (max relative difference "
                        f"{max_rel(outc, out1):.3g}, {drift:.3g}x the tolerance)",
                        f"more than 1/{f.borderline_factor:g} of the tolerance"):
        return

    def run_compiled() -> None:
        with torch.no_grad():
            compiled(*in1)

    result["compile_ms"] = _time(run_compiled, task.device, f.timing_runs)
    _dynamo.reset()
