"""Judge-v2 GPU benchmark: timing fidelity of repeated judgements, and judge latency.

Run from the repository root on the GPU machine:

    PYTHONPATH=src python3 benchmarks/judge_v2/judge_gpu.py --out $OUT \
        --kernelbench .bench/kernelbench.jsonl

Everything runs under one fresh, temporary CUDA_AGENT_HOME (set before cuda_agent is
imported), so build and baseline caches start cold and are shared within the run.

1. Timing fidelity. Each candidate is judged --repeats times (default 5), every judgement
   with ``JudgeConfig(device="cuda", cache_baselines=False, time_compile=False, seed=None)``,
   i.e. fresh reference and candidate processes and a fresh eager baseline each time
   (``--set cache_baselines=true``: as the judge does by default, the first judgement of a
   candidate measures the baselines and the others reuse them, so the speed-up's spread is
   the runtime's). Per
   candidate: the eager_ms, runtime_ms and speed-ups of every judgement, their spread
   ((max - min) / median, in %) and the rewards. Candidates:
     - KernelBench 1/12 with benchmarks/kernelbench_l1/12_Matmul_with_diagonal_matrices_;
     - KernelBench 1/40 with benchmarks/kernelbench_l1/40_LayerNorm;
     - a calibrated candidate (benchmarks/judge_v2/calibrated/): the task is
       y = tanh(x) * 0.5 + x, the candidate the same function in one fused kernel whose
       threads first busy-wait CALIBRATED_SPIN clock cycles (with ``--delay stream``: stream
       CALIBRATED_SPIN 16-byte loads from a scratch buffer, a delay that follows the memory
       system like the eager kernels, not the SM clock). Calibration: one judgement with
       spin 0 gives the eager time T_e; the candidate is then timed in this process (the
       judge's own ``timing.measure`` over a ``Rotation`` of the task's inputs, the extension
       loaded with ``load_extension`` and wrapped by the judge's ForwardGuard, as in a
       worker) while a safeguarded binary search finds the spin with T_e / t = 1.07 (within
       0.5%). One verification judgement follows; if its speed-up misses 1.07 by more than
       0.5%, the in-process target is corrected by the observed worker/in-process ratio and
       the search repeated once. The true speed-up 1.07 is above 1 / 0.95, so the right
       decision is "faster" (reward >= 2); the report counts the judgements that flip it.
   The judgements run round-robin (calibrated, 1/12, 1/40 in each round), so a shortened
   run still has some of each.
2. Judge latency. 1/40 as the agent's own verify and profile calls judge it
   (``JudgeConfig(device="cuda", candidate_processes=1)``, ``judge.config.IN_EPISODE``;
   cached baselines, torch.compile baseline timed): one judgement fills the baseline cache; then
   --latency-iters times (default 5): edit the LayerNorm .cu in a temporary copy (a new
   comment line and a changed constant, so its content hash changes) and time
   ``Judge(...).judge(task, Candidate.from_ref(dir))`` in this process (result.seconds and
   wall time); edit again and time ``python3 -m cuda_agent judge KB::1/40 DIR --device cuda
   --json --set candidate_processes=1`` (wall time). Reports medians (target: at most 3 s
   for build + verify + time), build seconds, runtime / eager and rewards.

The whole run keeps to --budget-s (default 480) by skipping judgements that would not fit;
when both parts run, part 1 may use --fidelity-share (default 0.55) of it and part 2 the
rest. What was cut is listed under Notes. For the full counts when judging is slow (1/40
writes several GB of trial outputs per judgement), run the parts separately: ``--parts fidelity``
and ``--parts latency`` (``--spin N`` reuses an earlier calibration).

Output: environment first, one line per step, a Markdown summary last; --out receives
judge_gpu.json (everything) and judge_gpu.md (the summary), rewritten after every step.
If pydantic is missing, the wheels in .whl/ (when present) are installed to a temporary
folder first.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib
import importlib.util
import inspect
import json
import os
import platform
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
SRC = REPO / "src"
KB_CANDIDATES = REPO / "benchmarks" / "kernelbench_l1"
CALIBRATED = HERE / "calibrated"

TARGET_SPEEDUP = 1.07
TOLERANCE = 0.005  # calibration: |T_e / t / 1.07 - 1| within this
SEARCH_TOLERANCE = 0.002  # the in-process search aims tighter, to leave room for noise
MARGIN = 0.95  # "faster" means runtime < MARGIN x eager (reward >= 2)
MAX_SPIN = 1 << 24
SEARCH_FROM = {"spin": 8192, "stream": 128}
"""Where the search for the delay starts (``--delay``): clock cycles, or sixteenths of a
16-byte load per thread (one wave of an H100 streams about 4.3 MB per whole load, so a
unit is about 0.27 MB, under 0.2% of the calibrated candidate's time)."""
SEARCH_FLOOR = {"spin": 1024, "stream": 64}
SEARCH_CAP = {"spin": MAX_SPIN, "stream": 1 << 18}
LATENCY_TARGET_S = 3.0

# (key, KernelBench level-1 problem id, candidate folder)
KB_PROBLEMS = (("1/12", 12, "12_Matmul_with_diagonal_matrices_"), ("1/40", 40, "40_LayerNorm"))
LATENCY_PROBLEM = (40, "40_LayerNorm")
DEVICE = "cuda"
ROUND_ORDER = ("calibrated", "1/12", "1/40")
# Seconds a step is assumed to take until one has been seen (conservative).
DEFAULT_ESTIMATES = {"calibrated": 15.0, "1/12": 15.0, "1/40": 30.0}

TEMP_DIRS: list[Path] = []
SITE_DIRS: list[Path] = []
_EDITS = [0]


class Stop(BaseException):
    """Raised by the SIGTERM/SIGINT handler: stop, write what there is."""


def delay_mode() -> str:
    """The calibrated candidate's delay (``CALIBRATED_DELAY``, set by ``--delay``)."""
    return os.environ.get("CALIBRATED_DELAY", "spin") or "spin"


def _on_signal(signum: int, _frame: Any) -> None:
    raise Stop(f"signal {signum}")


class Budget:
    def __init__(self, seconds: float):
        self.seconds = seconds
        self.start = time.monotonic()
        self.deadline = self.start + seconds

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def share(self, fraction: float) -> Budget:
        """A budget ending once ``fraction`` of this one (from its start) is spent."""
        part = Budget(0.0)
        part.start = self.start
        part.deadline = min(self.deadline, self.start + fraction * self.seconds)
        part.seconds = part.deadline - part.start
        return part


def log(msg: str = "") -> None:
    print(msg, flush=True)


def temp_dir(prefix: str) -> Path:
    path = Path(tempfile.mkdtemp(prefix=prefix))
    TEMP_DIRS.append(path)
    return path


def tail(text: str | bytes | None, n: int = 2000) -> str:
    if text is None:
        return ""
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return text[-n:]


def error_record(exc: BaseException | None = None) -> dict[str, Any]:
    tb = traceback.format_exc()
    last = tb.strip().splitlines()[-1] if tb.strip() else repr(exc)
    return {"error": last[:500], "traceback": tb[-4000:]}


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def spread_pct(values: list[float]) -> float | None:
    """(max - min) / median, in percent."""
    if len(values) < 2:
        return None
    mid = statistics.median(values)
    return (max(values) - min(values)) / mid * 100 if mid else None


def sd_pct(values: list[float]) -> float | None:
    """Standard deviation over the mean, in percent (steadier than the spread for n of 5)."""
    if len(values) < 2:
        return None
    mean = statistics.fmean(values)
    return statistics.stdev(values) / mean * 100 if mean else None


def fmt(value: Any, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def fmt_list(values: list[Any], digits: int = 4) -> str:
    return ", ".join(fmt(v, digits) for v in values) if values else "-"


# ---------------------------------------------------------------------------------------------
# Environment and dependencies


def python_path() -> str:
    parts = [str(SRC), *map(str, SITE_DIRS)]
    for part in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        if not part:
            continue
        absolute = str(Path(part).resolve())
        if absolute not in parts:
            parts.append(absolute)
    return os.pathsep.join(parts)


def set_python_path() -> None:
    """Absolute paths in PYTHONPATH, so judge workers and the CLI import the same code."""
    for path in [str(SRC), *map(str, SITE_DIRS)]:
        if path not in sys.path:
            sys.path.insert(0, path)
    os.environ["PYTHONPATH"] = python_path()


def ensure_dependencies() -> dict[str, Any]:
    """Install the wheels in .whl/ to a temporary folder if pydantic cannot be imported."""
    info: dict[str, Any] = {}
    try:
        import pydantic

        info["pydantic"] = pydantic.VERSION
        return info
    except ImportError:
        pass
    wheels = sorted((REPO / ".whl").glob("*.whl"))
    if not wheels:
        info["pydantic"] = "missing, and no wheels in .whl/"
        return info
    site = temp_dir("judge-v2-site-")
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
           "--no-compile", "--no-cache-dir", "--disable-pip-version-check", "--target",
           str(site), *map(str, wheels)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    info["wheels"] = [w.name for w in wheels]
    info["pip_rc"] = proc.returncode
    if proc.returncode != 0:
        info["pip_stderr"] = tail(proc.stderr, 1500)
    SITE_DIRS.append(site)
    set_python_path()
    importlib.invalidate_caches()
    try:
        import pydantic

        info["pydantic"] = f"{pydantic.VERSION} (installed from .whl/ to {site})"
    except ImportError as exc:
        info["pydantic"] = f"still missing: {exc}"
    return info


def gpu_state() -> str | None:
    nvsmi = shutil.which("nvidia-smi")
    if not nvsmi:
        return None
    try:
        proc = subprocess.run(
            [nvsmi, "--query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,"
             "clocks.mem,temperature.gpu,power.draw,pstate", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20, check=False)
        return proc.stdout.strip() or tail(proc.stderr, 300)
    except Exception as exc:  # noqa: BLE001 - report, never stop
        return f"nvidia-smi failed: {exc!r}"


def environment() -> dict[str, Any]:
    info: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "cuda_agent_home": os.environ.get("CUDA_AGENT_HOME"),
    }
    try:
        commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True, timeout=10, check=False)
        info["commit"] = commit.stdout.strip() or None
    except Exception:  # noqa: BLE001
        info["commit"] = None
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_cuda"] = torch.version.cuda
        info["cuda_available"] = torch.cuda.is_available()
        if torch.cuda.is_available():
            info["device"] = torch.cuda.get_device_name()
            props = torch.cuda.get_device_properties(0)
            info["sm"] = f"{props.major}.{props.minor}"
            info["multiprocessors"] = props.multi_processor_count
            info["memory_gib"] = round(props.total_memory / 2**30, 1)
    except Exception as exc:  # noqa: BLE001
        info["torch_error"] = repr(exc)
    info["gpu_state"] = gpu_state()
    nvcc = shutil.which("nvcc") or next(
        (str(p) for p in [Path(os.environ.get("CUDA_HOME") or "/usr/local/cuda") / "bin" / "nvcc"]
         if p.exists()), None)
    info["nvcc_path"] = nvcc
    if nvcc:
        try:
            out = subprocess.run([nvcc, "--version"], capture_output=True, text=True,
                                 timeout=30, check=False).stdout
            lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
            info["nvcc"] = next((ln for ln in lines if "release" in ln), lines[-1] if lines else "")
        except Exception as exc:  # noqa: BLE001
            info["nvcc"] = f"error: {exc!r}"
    try:
        from cuda_agent.judge.config import JUDGE_VERSION

        info["judge_version"] = JUDGE_VERSION
    except Exception as exc:  # noqa: BLE001
        info["judge_version"] = f"import failed: {exc!r}"
    return info


# ---------------------------------------------------------------------------------------------
# Report


class Report:
    """The JSON report; saved (with the Markdown summary) after every step."""

    def __init__(self, out: Path | None, argv: list[str]):
        self.out = out
        self.data: dict[str, Any] = {"argv": argv, "notes": [], "durations": {}}

    def note(self, text: str) -> None:
        self.data["notes"].append(text)
        log(f"  note: {text}")

    def save(self) -> None:
        if self.out is None:
            return
        try:
            self.out.mkdir(parents=True, exist_ok=True)
            (self.out / "judge_gpu.json").write_text(json.dumps(self.data, indent=1,
                                                                default=str))
            (self.out / "judge_gpu.md").write_text(markdown(self.data))
        except Exception as exc:  # noqa: BLE001
            log(f"could not write to {self.out}: {exc!r}")

    def observe(self, key: str, seconds: float) -> None:
        self.data["durations"].setdefault(key, []).append(round(seconds, 3))

    def estimate(self, key: str) -> float:
        seen = self.data["durations"].get(key)
        if seen:
            return max(seen)
        if key in DEFAULT_ESTIMATES:
            return DEFAULT_ESTIMATES[key]
        # latency steps, from a 1/40 judgement when one has been seen
        base = self.data["durations"].get("1/40")
        base_s = max(base) if base else DEFAULT_ESTIMATES["1/40"]
        return {"fill": base_s + 25.0, "inprocess": base_s + 3.0, "cli": base_s + 6.0}.get(
            key, base_s)


# ---------------------------------------------------------------------------------------------
# Judging


def process_timeout(budget: Budget) -> float:
    return max(60.0, min(300.0, budget.left()))


def result_record(result: Any, wall: float) -> dict[str, Any]:
    from cuda_agent.results import to_dict

    data = to_dict(result)
    data.pop("profile", None)
    build = data.get("build")
    if isinstance(build, dict) and build.get("ok"):
        build.pop("log", None)
    data["wall_s"] = wall
    return data


def judge_in_process(config: dict[str, Any], task: Any, candidate_dir: Path,
                     env: dict[str, str], budget: Budget) -> dict[str, Any]:
    """One judgement in this process (the judge starts its own fresh workers)."""
    from cuda_agent.judge import Candidate, Judge, JudgeConfig

    cfg = JudgeConfig(**config, process_timeout_s=process_timeout(budget))
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        start = time.perf_counter()
        try:
            result = Judge(cfg).judge(task, Candidate.from_ref(candidate_dir))
        except Exception:  # noqa: BLE001 - JudgeError and the like: not a verdict
            rec = error_record()
            rec["wall_s"] = time.perf_counter() - start
            return rec
        return result_record(result, time.perf_counter() - start)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def brief(rec: dict[str, Any]) -> str:
    if rec.get("error"):
        return f"ERROR {rec['error']} (wall {fmt(rec.get('wall_s'), 3)} s)"
    text = (f"reward {rec.get('reward')} correct {fmt(rec.get('correct'))} "
            f"runtime {fmt(rec.get('runtime_ms'))} ms eager {fmt(rec.get('eager_ms'))} ms "
            f"speed-up {fmt(rec.get('speedup_vs_eager'))} judge {fmt(rec.get('seconds'), 3)} s "
            f"wall {fmt(rec.get('wall_s'), 3)} s")
    if rec.get("compile_ms") is not None:
        text += f" compile {fmt(rec.get('compile_ms'))} ms"
    build = rec.get("build") or {}
    if build:
        text += f" build {fmt(build.get('seconds'), 3)} s"
    if not rec.get("correct"):
        text += f" reasons: {'; '.join(map(str, rec.get('reasons') or []))[:400]}"
    return text


def copy_candidate(source: Path, prefix: str) -> Path:
    work = temp_dir(prefix)
    dest = work / source.name
    shutil.copytree(source, dest, ignore=shutil.ignore_patterns("build", "__pycache__"))
    return dest


# ---------------------------------------------------------------------------------------------
# Part 1: calibration of the calibrated candidate


class InProcessTimer:
    """The calibrated candidate and the task's eager model, timed in this process the way a
    judge worker times them (same ``measure``, rotated inputs, ForwardGuard-wrapped module)."""

    def __init__(self, task: Any, extension_path: str, candidate_dir: Path, budget_s: float):
        import torch

        from cuda_agent.build import load_extension
        from cuda_agent.judge.guard import ForwardGuard
        from cuda_agent.judge.source import CallSource
        from cuda_agent.judge.worker import (
            autocast,
            load_task_namespace,
            make_inputs,
            set_precision,
        )

        self.torch = torch
        self.budget_s = budget_s
        precision = task.precision.value
        set_precision(precision)
        extension = load_extension(extension_path)
        self.extension = extension
        spec = importlib.util.spec_from_file_location("judge_v2_calibrated_model_new",
                                                      candidate_dir / "model_new.py")
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot import {candidate_dir / 'model_new.py'}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        self.ns = load_task_namespace(task.code)
        self.model = module.ModelNew().to(DEVICE).eval()
        # As in a judge worker: the extension is also the guard's process-wide operator
        # tracer where this version of the guard and the fixed layer have one.
        if "tracer" in inspect.signature(ForwardGuard).parameters and \
                hasattr(extension, "_trace_begin"):
            self.guard = ForwardGuard([extension], tracer=extension)
        else:
            self.guard = ForwardGuard([extension])
        reference = self.ns["Model"](*self.ns["get_init_inputs"]()).to(DEVICE).eval()

        def eager(*inputs: Any) -> Any:
            with autocast(precision, DEVICE):
                return reference(*inputs)

        self.eager = eager
        # fresh contents for every call, as the judge's calls have
        self.rotation = CallSource(lambda seed, scale: make_inputs(self.ns, seed, DEVICE,
                                                                   scale))
        self.check_inputs = make_inputs(self.ns, secrets.randbelow(2**30), DEVICE)

    def max_abs_error(self, spin: int) -> float:
        torch = self.torch
        self.model.spin = int(spin)
        with torch.no_grad():
            out = self.model(*self.check_inputs)
            ref = self.eager(*self.check_inputs)
            if DEVICE.startswith("cuda"):
                torch.cuda.synchronize()
            return float((out - ref).abs().max())

    def _measure(self, fn: Any) -> dict[str, Any]:
        from cuda_agent.judge.timing import load_blocker, measure
        from cuda_agent.judge.timing import stats as summarise

        # the same time meaning as the judge's workers (device time with the blocker)
        samples = measure(fn, self.rotation, DEVICE, warmup=10, min_runs=100, max_runs=4000,
                          budget_s=self.budget_s, target_rel_ci=0.001,
                          blocker=load_blocker(self.extension)).samples
        stats = summarise(samples)
        return {"ms": stats.median_ms, "ci_low_ms": stats.ci_low_ms,
                "ci_high_ms": stats.ci_high_ms, "runs": stats.runs}

    def candidate(self, spin: int) -> dict[str, Any]:
        self.model.spin = int(spin)

        def guarded(*inputs: Any) -> Any:  # every call under the guard, as in a worker
            return self.guard.run(self.model, list(inputs))[0]

        rec = self._measure(guarded)
        rec["spin"] = int(spin)
        return rec

    def eager_time(self) -> dict[str, Any]:
        return self._measure(self.eager)

    def close(self) -> None:
        for name in ("model", "rotation", "check_inputs", "eager", "ns", "guard"):
            setattr(self, name, None)
        try:
            self.torch.cuda.synchronize()
            self.torch.cuda.empty_cache()
        except Exception:  # noqa: BLE001
            pass


def search_spin(timer: InProcessTimer, target_ms: float, budget: Budget,
                start_hi: int | None = None, stop_at: float = 0.0) -> dict[str, Any]:
    """Safeguarded binary search (bisection steered by interpolation) for t(spin) = target."""
    points: list[dict[str, Any]] = []

    def meas(spin: int) -> float:
        rec = timer.candidate(spin)
        rec["ratio_to_target"] = rec["ms"] / target_ms
        points.append(rec)
        log(f"    spin {spin:>9}: {rec['ms']:.5f} ms ({rec['runs']} runs), "
            f"t / target {rec['ratio_to_target']:.4f}")
        return rec["ms"]

    out: dict[str, Any] = {"target_ms": target_ms, "points": points, "converged": False}
    lo, t_lo = 0, meas(0)
    if t_lo >= target_ms * (1 - SEARCH_TOLERANCE):
        out["error"] = (f"with no delay the candidate takes {t_lo:.4g} ms, not under the "
                        f"target {target_ms:.4g} ms: cannot calibrate")
        out["spin"], out["ms"] = 0, t_lo
        return out
    floor = SEARCH_FLOOR[delay_mode()]
    hi = max(floor, int(SEARCH_FROM[delay_mode()] if start_hi is None else start_hi))
    t_hi = meas(hi)
    while t_hi < target_ms:
        lo, t_lo = hi, t_hi
        hi *= 2
        if hi > SEARCH_CAP[delay_mode()]:
            out["error"] = f"no spin up to {hi // 2} reaches the target"
            break
        if budget.left() < stop_at:
            out["error"] = f"time budget spent before the target was bracketed (spin {hi // 2})"
            break
        t_hi = meas(hi)
    if "error" not in out:
        for _ in range(14):
            if budget.left() < stop_at or hi - lo <= 1:
                break
            frac = (target_ms - t_lo) / (t_hi - t_lo) if t_hi > t_lo else 0.5
            frac = min(max(frac, 0.1), 0.9)  # always shrink the bracket by at least 10%
            mid = min(max(lo + round((hi - lo) * frac), lo + 1), hi - 1)
            t_mid = meas(mid)
            if abs(t_mid / target_ms - 1) <= SEARCH_TOLERANCE:
                break
            if t_mid < target_ms:
                lo, t_lo = mid, t_mid
            else:
                hi, t_hi = mid, t_mid
    best = min(points, key=lambda p: abs(p["ratio_to_target"] - 1))
    spin = best["spin"]
    # Confirm: the chosen spin twice more; the median of the three is its time.
    confirm = [best["ms"]]
    for _ in range(2):
        if budget.left() < stop_at:
            break
        confirm.append(timer.candidate(spin)["ms"])
    out["spin"] = spin
    out["ms"] = statistics.median(confirm)
    out["confirm_ms"] = confirm
    out["ratio_to_target"] = out["ms"] / target_ms
    out["converged"] = abs(out["ratio_to_target"] - 1) <= TOLERANCE
    log(f"    chosen spin {spin}: {out['ms']:.5f} ms (confirmations {fmt_list(confirm, 5)}), "
        f"t / target {out['ratio_to_target']:.4f}")
    return out


def calibrate(report: Report, args: argparse.Namespace, budget: Budget
              ) -> dict[str, Any] | None:
    """Find the spin; returns the calibrated candidate's fidelity entry, or None."""
    from cuda_agent.tasks import load_task

    cal: dict[str, Any] = {"target_speedup": TARGET_SPEEDUP, "tolerance": TOLERANCE,
                           "judgements": []}
    report.data["calibration"] = cal
    task_path = CALIBRATED / "task.py"
    task = load_task(str(task_path))
    candidate = copy_candidate(CALIBRATED / "candidate", "judge-v2-calibrated-")
    entry = {"key": "calibrated", "task_ref": str(task_path), "task": task,
             "candidate": candidate, "env": {}}
    fidelity_config = {"device": DEVICE, "cache_baselines": False, "time_compile": False,
                       "seed": None}

    if args.spin is not None:
        cal["spin"] = int(args.spin)
        cal["source"] = "--spin"
        entry["env"] = {"CALIBRATED_SPIN": str(int(args.spin))}
        log(f"  spin {args.spin} given with --spin: no calibration")
        return entry

    from cuda_agent.build import BuildConfig, Builder

    start = time.perf_counter()
    build = Builder(BuildConfig(device=DEVICE)).build(candidate)
    cal["build"] = {"ok": build.ok, "seconds": build.seconds, "compiled": list(build.compiled),
                    "wall_s": time.perf_counter() - start}
    log(f"  build: ok={build.ok} {build.seconds:.2f} s compiled={list(build.compiled)}")
    if not build.ok:
        cal["build"]["errors"] = [str(d) for d in build.diagnostics][:10]
        cal["build"]["log"] = tail(build.log, 3000)
        cal["error"] = "the calibrated candidate did not build"
        log(cal["build"]["log"])
        return None
    report.save()

    # 1. T_e from one judgement with no delay (also checks the candidate is correct).
    rec = judge_in_process(fidelity_config, task, candidate, {"CALIBRATED_SPIN": "0"}, budget)
    rec.update(purpose="eager time T_e (spin 0)", spin=0)
    cal["judgements"].append(rec)
    report.observe("calibrated", rec["wall_s"])
    log(f"  spin-0 judgement: {brief(rec)}")
    report.save()
    eager_judged = rec.get("eager_ms")
    if rec.get("error") or not rec.get("correct"):
        cal["error"] = "the spin-0 judgement failed or found the candidate incorrect"
        return None
    report.save()

    # 2. In-process timer and search.
    timer = InProcessTimer(task, build.extension_path, candidate, args.calibration_measure_s)
    try:
        cal["max_abs_error_spin0"] = timer.max_abs_error(0)
        cal["max_abs_error_spin1000"] = timer.max_abs_error(1000)
        cal["inprocess_eager"] = [timer.eager_time()]
        log(f"  in-process eager {cal['inprocess_eager'][0]['ms']:.5f} ms, judged eager "
            f"{fmt(eager_judged, 5)} ms; max |candidate - eager| "
            f"{cal['max_abs_error_spin0']:.3g}")
        t_e = eager_judged
        if t_e is None:
            t_e = cal["inprocess_eager"][0]["ms"]
            report.note("calibration: the spin-0 judgement gave no eager time; using the "
                        "in-process eager time as T_e")
        cal["T_e_ms"] = t_e
        target = t_e / TARGET_SPEEDUP
        log(f"  search: target {target:.5f} ms (T_e {t_e:.5f} / {TARGET_SPEEDUP})")
        search = search_spin(timer, target, budget)
        cal["search"] = [search]
        spin = int(search["spin"])
        if search.get("error"):
            cal["error"] = search["error"]
            log(f"  calibration failed: {search['error']}")
            return None

        # 3. One verification judgement; retarget once if it misses by more than TOLERANCE.
        if budget.left() > report.estimate("calibrated") * 1.2 + 5:
            rec = judge_in_process(fidelity_config, task, candidate,
                                   {"CALIBRATED_SPIN": str(spin)}, budget)
            rec.update(purpose="verification", spin=spin)
            cal["judgements"].append(rec)
            report.observe("calibrated", rec["wall_s"])
            log(f"  verification judgement (spin {spin}): {brief(rec)}")
            report.save()
            if rec.get("correct") and rec.get("runtime_ms") and rec.get("eager_ms"):
                eager_mean = statistics.fmean([t_e, rec["eager_ms"]])
                judged = eager_mean / rec["runtime_ms"]
                cal["verification_speedup"] = judged
                cal["T_e_ms"] = eager_mean
                if abs(judged / TARGET_SPEEDUP - 1) > TOLERANCE:
                    offset = rec["runtime_ms"] / search["ms"]
                    target2 = eager_mean / TARGET_SPEEDUP / offset
                    cal["retarget"] = {"worker_over_inprocess": offset, "target_ms": target2}
                    log(f"  judged speed-up {judged:.4f} misses {TARGET_SPEEDUP}: retarget "
                        f"in-process to {target2:.5f} ms (worker / in-process {offset:.4f})")
                    search2 = search_spin(timer, target2, budget, start_hi=spin)
                    cal["search"].append(search2)
                    if not search2.get("error"):
                        spin = int(search2["spin"])
        else:
            report.note("calibration: no time for the verification judgement")
        cal["spin"] = spin
        cal["source"] = "search"
        cal["inprocess_eager"].append(timer.eager_time())
        final = timer.candidate(spin)
        cal["inprocess_candidate_ms"] = final["ms"]
        eager_ip = statistics.fmean(e["ms"] for e in cal["inprocess_eager"])
        cal["inprocess_speedup"] = eager_ip / final["ms"]
        offset = (cal.get("retarget") or {}).get("worker_over_inprocess", 1.0)
        cal["expected_judged_speedup"] = cal["T_e_ms"] / (final["ms"] * offset)
        cal["max_abs_error_final"] = timer.max_abs_error(spin)
        log(f"  calibrated spin {spin}: in-process {final['ms']:.5f} ms, in-process eager "
            f"{eager_ip:.5f} ms (speed-up {cal['inprocess_speedup']:.4f}); judged T_e "
            f"{cal['T_e_ms']:.5f} ms -> expected judged speed-up "
            f"{cal['expected_judged_speedup']:.4f}")
    finally:
        timer.close()
    entry["env"] = {"CALIBRATED_SPIN": str(spin)}
    return entry


# ---------------------------------------------------------------------------------------------
# Part 1: fidelity


def fidelity_summary(recs: list[dict[str, Any]], truth_faster: bool | None) -> dict[str, Any]:
    ok = [r for r in recs if not r.get("error")]
    eager = [r["eager_ms"] for r in ok if r.get("eager_ms") is not None]
    runtime = [r["runtime_ms"] for r in ok if r.get("runtime_ms") is not None]
    speedup = [r["speedup_vs_eager"] for r in ok if r.get("speedup_vs_eager") is not None]
    # The judge's decision "faster than eager by the margin" is reward >= 2; a judgement
    # that raised (no verdict) is counted under errors, not as a decision.
    decisions = [(r.get("reward") or -1) >= 2 for r in ok]
    out: dict[str, Any] = {
        "n": len(recs), "errors": len(recs) - len(ok), "verdicts": len(ok),
        "eager_ms": eager, "runtime_ms": runtime, "speedup": speedup,
        "eager_spread_pct": spread_pct(eager), "runtime_spread_pct": spread_pct(runtime),
        "speedup_spread_pct": spread_pct(speedup),
        "speedup_sd_pct": sd_pct(speedup),
        "eager_median_ms": median(eager), "runtime_median_ms": median(runtime),
        "speedup_median": median(speedup),
        "speedup_min": min(speedup) if speedup else None,
        "speedup_max": max(speedup) if speedup else None,
        "rewards": [r.get("reward") for r in recs],
        "correct": [r.get("correct") for r in recs],
        "faster_decisions": sum(decisions),
        "runtime_rel_ci_pct": [100 * _rel_ci(r.get("timing")) for r in ok if r.get("timing")],
        "eager_rel_ci_pct": [100 * _rel_ci(r.get("eager_timing")) for r in ok
                             if r.get("eager_timing")],
        "judge_seconds": [r.get("seconds") for r in ok],
        "wall_s": [r.get("wall_s") for r in recs],
        "flags": sorted({f for r in ok for f in (r.get("flags") or [])}),
    }
    if truth_faster is not None:
        out["truth"] = "faster" if truth_faster else "not faster"
        out["flips"] = sum(d != truth_faster for d in decisions)
    return out


def _rel_ci(stats: dict[str, Any] | None) -> float:
    if not stats or not stats.get("median_ms"):
        return 0.0
    return (stats.get("ci_high_ms", 0.0) - stats.get("ci_low_ms", 0.0)) / (2 * stats["median_ms"])


def fidelity(report: Report, args: argparse.Namespace, budget: Budget, kernelbench: Path
             ) -> None:
    """Part 1; ``budget`` is this part's share of the run."""
    from cuda_agent.tasks import load_task

    fid: dict[str, Any] = {"config": {"device": DEVICE, "cache_baselines": False,
                                      "time_compile": False, "seed": None, **args.set},
                           "repeats": args.repeats, "candidates": {}}
    report.data["fidelity"] = fid
    config = dict(fid["config"])

    entries: dict[str, dict[str, Any]] = {}
    wanted = set(args.candidates)
    for key, pid, folder in KB_PROBLEMS:
        if key not in wanted:
            continue
        ref = f"{kernelbench}::1/{pid}"
        fid["candidates"][key] = {"task_ref": ref, "candidate": str(KB_CANDIDATES / folder),
                                  "judgements": []}
        try:
            entries[key] = {"key": key, "task_ref": ref, "task": load_task(ref),
                            "candidate": copy_candidate(KB_CANDIDATES / folder,
                                                        f"judge-v2-{pid}-"), "env": {}}
        except Exception:  # noqa: BLE001
            fid["candidates"][key].update(error_record())
            log(f"  {key}: cannot load: {fid['candidates'][key]['error']}")

    if "calibrated" in wanted:
        fid["candidates"]["calibrated"] = {"task_ref": str(CALIBRATED / "task.py"),
                                           "candidate": str(CALIBRATED / "candidate"),
                                           "judgements": []}
        log("\n# 1. Calibration of the calibrated candidate")
        try:
            entry = calibrate(report, args, budget)
            if entry is not None:
                entries["calibrated"] = entry
                fid["candidates"]["calibrated"]["spin"] = int(entry["env"]["CALIBRATED_SPIN"])
            else:
                fid["candidates"]["calibrated"]["error"] = (
                    report.data.get("calibration", {}).get("error") or "calibration failed")
        except Exception:  # noqa: BLE001
            rec = error_record()
            report.data.setdefault("calibration", {}).update(rec)
            fid["candidates"]["calibrated"]["error"] = rec["error"]
            log(rec["traceback"])
        report.save()

    log(f"\n# 1. Timing fidelity: {args.repeats} judgements per candidate, round-robin")
    skipped: dict[str, int] = {}
    for round_i in range(args.repeats):
        for key in ROUND_ORDER:
            entry = entries.get(key)
            if entry is None:
                continue
            slot = fid["candidates"][key]
            need = report.estimate(key) * 1.15 + 3
            if budget.left() < need:
                if key not in skipped:
                    log(f"  {key}: no time for judgement {round_i + 1} "
                        f"({max(budget.left(), 0):.0f} s of part 1 left, ~{need:.0f} s needed)")
                skipped[key] = skipped.get(key, 0) + 1
                continue
            try:
                rec = judge_in_process(config, entry["task"], entry["candidate"], entry["env"],
                                       budget)
            except Exception:  # noqa: BLE001
                rec = error_record()
            rec["round"] = round_i + 1
            if key == "calibrated":
                rec["spin"] = int(entry["env"].get("CALIBRATED_SPIN", "0"))
            slot["judgements"].append(rec)
            if rec.get("wall_s") is not None:
                report.observe(key, rec["wall_s"])
            log(f"  [{round_i + 1}] {key}: {brief(rec)}")
            slot["summary"] = fidelity_summary(slot["judgements"], True)
            report.save()
    for key, count in skipped.items():
        report.note(f"fidelity {key}: {count} of {args.repeats} judgements skipped for the "
                    f"time budget of part 1 ({budget.seconds:.0f} s); for all of them run "
                    "with --parts fidelity")
    for slot in fid["candidates"].values():
        slot["summary"] = fidelity_summary(slot["judgements"], True)
    report.save()


# ---------------------------------------------------------------------------------------------
# Part 2: latency


def edited(original: str, tag: str) -> str:
    """The original source plus a new comment line and a constant whose value changes."""
    _EDITS[0] += 1
    n = _EDITS[0]
    return (f"{original.rstrip()}\n// judge-v2 latency benchmark edit {n} ({tag}): "
            f"{time.time_ns()}\n[[maybe_unused]] static constexpr int kJudgeLatencyEdit = "
            f"{1000 + n};\n")


def parse_json_output(text: str) -> dict[str, Any] | None:
    text = (text or "").strip()
    if not text:
        return None
    try:
        value = json.loads(text)
        return value if isinstance(value, dict) else None
    except json.JSONDecodeError:
        pass
    start, end = text.find("{"), text.rfind("}")
    if 0 <= start < end:
        try:
            value = json.loads(text[start:end + 1])
            return value if isinstance(value, dict) else None
        except json.JSONDecodeError:
            return None
    return None


def _proc_stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, session id) of a process, from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[1]), int(fields[3])
    except (OSError, IndexError, ValueError):
        return None


def kill_tree(pid: int) -> None:
    """Kill a command started here and the judge workers it started in their own sessions."""
    children = []
    sessions = {pid}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = _proc_stat(int(entry.name))
            if stat and stat[0] == pid:
                children.append(int(entry.name))
    sessions.update(children)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        stat = _proc_stat(int(entry.name))
        if stat and stat[1] in sessions and int(entry.name) != pid:
            with contextlib.suppress(OSError):
                os.kill(int(entry.name), signal.SIGKILL)
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGKILL)


def cli_judge(task_ref: str, workspace: Path, timeout: float) -> dict[str, Any]:
    from cuda_agent.judge.config import IN_EPISODE

    episode = [arg for key, value in IN_EPISODE.items()  # as the agent's own calls
               for arg in ("--set", f"{key}={json.dumps(value)}")]
    cmd = [sys.executable, "-m", "cuda_agent", "judge", task_ref, str(workspace), "--device",
           DEVICE, "--json", *episode]
    env = {**os.environ, "PYTHONPATH": python_path(), "PYTHONUNBUFFERED": "1"}
    rec: dict[str, Any] = {"command": " ".join(cmd)}
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=str(REPO), start_new_session=True)
    try:
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid)
            stdout, stderr = proc.communicate()
            rec.update(error=f"timed out after {timeout:.0f} s", stderr=tail(stderr),
                       wall_s=time.perf_counter() - start)
            return rec
    except BaseException:
        kill_tree(proc.pid)
        proc.wait()
        raise
    rec["wall_s"] = time.perf_counter() - start
    rec["rc"] = proc.returncode
    data = parse_json_output(stdout)
    if data is None:
        rec.update(error=f"no JSON verdict (rc={proc.returncode})", stdout=tail(stdout),
                   stderr=tail(stderr))
        return rec
    build = data.get("build")
    if isinstance(build, dict) and build.get("ok"):
        build.pop("log", None)
    data.pop("profile", None)
    rec.update(data)
    if proc.returncode != 0:
        rec["stderr"] = tail(stderr, 1000)
    return rec


def latency_summary(lat: dict[str, Any]) -> dict[str, Any]:
    fill_eager = (lat.get("fill") or {}).get("eager_ms")
    fill_compile = (lat.get("fill") or {}).get("compile_ms")

    def series(kind: str) -> dict[str, Any]:
        recs = [it[kind] for it in lat.get("iterations", []) if kind in it]
        ok = [r for r in recs if not r.get("error")]
        seconds = [r["seconds"] for r in ok if r.get("seconds") is not None]
        wall = [r["wall_s"] for r in ok if r.get("wall_s") is not None]
        builds = [r["build"]["seconds"] for r in ok
                  if isinstance(r.get("build"), dict) and r["build"].get("seconds") is not None]
        rest = [r["seconds"] - r["build"]["seconds"] for r in ok
                if r.get("seconds") is not None and isinstance(r.get("build"), dict)
                and r["build"].get("seconds") is not None]
        return {
            "n": len(recs), "errors": len(recs) - len(ok),
            "seconds": seconds, "wall_s": wall, "build_s": builds,
            "seconds_median": median(seconds), "wall_median": median(wall),
            "build_median": median(builds), "verify_and_time_median": median(rest),
            "runtime_ms": [r.get("runtime_ms") for r in ok],
            "eager_ms": [r.get("eager_ms") for r in ok],
            "compile_ms": [r.get("compile_ms") for r in ok],
            "rewards": [r.get("reward") for r in recs],
            "compiled_files": [list((r.get("build") or {}).get("compiled") or []) for r in ok],
            "baselines_from_cache": bool(ok) and fill_eager is not None and all(
                r.get("eager_ms") == fill_eager and r.get("compile_ms") == fill_compile
                for r in ok),
        }

    inproc, cli = series("inprocess"), series("cli")
    return {
        "inprocess": inproc, "cli": cli, "target_s": LATENCY_TARGET_S,
        "inprocess_target_met": (inproc["seconds_median"] is not None
                                 and inproc["seconds_median"] <= LATENCY_TARGET_S),
        "cli_target_met": (cli["wall_median"] is not None
                           and cli["wall_median"] <= LATENCY_TARGET_S),
    }


def latency(report: Report, args: argparse.Namespace, budget: Budget, kernelbench: Path
            ) -> None:
    from cuda_agent.judge.config import IN_EPISODE
    from cuda_agent.tasks import load_task

    pid, folder = LATENCY_PROBLEM
    task_ref = f"{kernelbench}::1/{pid}"
    lat: dict[str, Any] = {"task_ref": task_ref, "config": {"device": DEVICE, **IN_EPISODE},
                           "iterations_planned": args.latency_iters, "iterations": []}
    report.data["latency"] = lat
    task = load_task(task_ref)
    workspace = copy_candidate(KB_CANDIDATES / folder, "judge-v2-latency-")
    kernels = workspace / "kernels"
    sources = sorted(kernels.rglob("*.cu")) or sorted(
        p for p in kernels.rglob("*.cpp") if not p.name.endswith("_binding.cpp"))
    sources = sources or sorted(kernels.rglob("*.cpp"))
    if not sources:
        raise RuntimeError(f"no kernel source in {kernels}")
    cu = sources[0]
    lat["workspace"], lat["edited_file"] = str(workspace), str(cu.relative_to(workspace))
    original = cu.read_text()
    config = {"device": DEVICE, **IN_EPISODE}  # the 3 s target is the agent's own calls'
    try:
        need = report.estimate("fill") * 1.15
        if budget.left() < 0.6 * need:
            report.note(f"latency: skipped (time budget: {budget.left():.0f} s left, the "
                        f"cache-filling judgement may need ~{need:.0f} s)")
            lat["error"] = "skipped: time budget"
            return
        if budget.left() < need:
            report.note(f"latency: only {budget.left():.0f} s left, the cache-filling "
                        f"judgement may need ~{need:.0f} s; trying anyway")
        rec = judge_in_process(config, task, workspace, {}, budget)
        rec["purpose"] = "fill the baseline cache"
        lat["fill"] = rec
        report.observe("fill", rec["wall_s"])
        log(f"  cache fill: {brief(rec)}")
        report.save()
        if rec.get("error"):
            lat["error"] = "the cache-filling judgement failed"
            return
        for i in range(args.latency_iters):
            item: dict[str, Any] = {"i": i + 1}
            for kind in ("inprocess", "cli"):
                need = report.estimate(kind) * 1.15 + 3
                if budget.left() < need:
                    report.note(f"latency iteration {i + 1} {kind}: skipped (time budget: "
                                f"{budget.left():.0f} s left, ~{need:.0f} s needed); for all "
                                f"{args.latency_iters} run with --parts latency")
                    continue
                cu.write_text(edited(original, f"{kind} {i + 1}"))
                try:
                    if kind == "inprocess":
                        rec = judge_in_process(config, task, workspace, {}, budget)
                    else:
                        timeout = max(60.0, min(300.0, budget.left() + 30))
                        rec = cli_judge(task_ref, workspace, timeout)
                except Exception:  # noqa: BLE001
                    rec = error_record()
                item[kind] = rec
                if rec.get("wall_s") is not None:
                    report.observe(kind, rec["wall_s"])
                log(f"  [{i + 1}] {kind}: {brief(rec)}")
            if len(item) > 1:
                lat["iterations"].append(item)
            lat["summary"] = latency_summary(lat)
            report.save()
            if len(item) == 1:
                break
    finally:
        cu.write_text(original)
        lat["summary"] = latency_summary(lat)
        report.save()


# ---------------------------------------------------------------------------------------------
# Summary


def markdown(data: dict[str, Any]) -> str:
    env = data.get("environment") or {}
    lines = [
        f"## Judge-v2 GPU benchmark ({env.get('date', '?')}, commit {env.get('commit') or '?'})",
        "",
        f"{env.get('device', 'no GPU')} ({env.get('multiprocessors', '?')} SMs) | torch "
        f"{env.get('torch', '?')} (CUDA {env.get('torch_cuda', '?')}) | nvcc "
        f"{env.get('nvcc', '?')} | python {env.get('python', '?')} | {env.get('cpus', '?')} "
        f"CPUs | {env.get('judge_version', '?')} | total {fmt(data.get('total_s'), 4)} s of "
        f"{fmt(data.get('budget_s'), 4)} s budget",
        "",
    ]
    fid = data.get("fidelity")
    if fid:
        given = {k: v for k, v in (fid.get("config") or {}).items()
                 if k not in ("device", "cache_baselines", "time_compile", "seed")
                 or (k == "seed" and v is not None)}
        seeds = (f"seed {given.pop('seed')}" if "seed" in given else "secret seeds")
        extra = "".join(f", {k}={v}" for k, v in given.items())
        cached = ("baselines measured by each candidate's first judgement and cached, as "
                  "the judge does by default" if (fid.get("config") or {}).get(
                      "cache_baselines") else "baselines not cached")
        lines += [
            f"### 1. Timing fidelity ({fid.get('repeats')} judgements each planned; fresh "
            f"processes, {cached}, no torch.compile baseline, {seeds}{extra})",
            "",
            "| candidate | n | eager ms | runtime ms | speed-up | spread eager / runtime / "
            "speed-up % | SD speed-up % | rewards | faster (reward >= 2) | median CI "
            "half-width runtime / eager % | median judge s |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for key, slot in fid.get("candidates", {}).items():
            s = slot.get("summary") or {}
            if slot.get("error") and not s.get("n"):
                lines.append(f"| {key} | 0 | error: {_cell(slot['error'])} | | | | | | | | |")
                continue
            delay = "streamed loads" if data.get("delay") == "stream" else "spin"
            label = key + (f" ({delay} {slot['spin']})" if "spin" in slot else "")
            rt_ci = median(s.get("runtime_rel_ci_pct") or [])
            eg_ci = median(s.get("eager_rel_ci_pct") or [])
            secs = [x for x in s.get("judge_seconds") or [] if x is not None]
            lines.append(
                f"| {label} | {s.get('n', 0)} | {fmt_list(s.get('eager_ms') or [])} | "
                f"{fmt_list(s.get('runtime_ms') or [])} | {fmt_list(s.get('speedup') or [])} | "
                f"{fmt(s.get('eager_spread_pct'), 3)} / {fmt(s.get('runtime_spread_pct'), 3)} / "
                f"{fmt(s.get('speedup_spread_pct'), 3)} | {fmt(s.get('speedup_sd_pct'), 3)} | "
                f"{fmt_list(s.get('rewards') or [])} | "
                f"{s.get('faster_decisions', 0)}/{s.get('verdicts', 0)} | {fmt(rt_ci, 2)} / "
                f"{fmt(eg_ci, 2)} | {fmt(median(secs), 3)} |")
        lines.append("")
    cal = data.get("calibration")
    if cal:
        cslot = ((fid or {}).get("candidates") or {}).get("calibrated") or {}
        s = cslot.get("summary") or {}
        lines.append("#### Calibrated candidate (true speed-up 1.07 > 1/0.95: the right "
                     "decision is 'faster')")
        lines.append("")
        if cal.get("source") == "--spin":
            lines.append(f"- spin {cal.get('spin')} given with --spin (not calibrated here): "
                         "its true speed-up is 1.07 only on a device whose SM clock matches "
                         "the one it was calibrated on; if the judged speed-ups sit far from "
                         "1.07, the flips below count against a wrong truth")
        else:
            searches = cal.get("search") or []
            last = searches[-1] if searches else {}
            lines.append(
                f"- T_e (judged eager) {fmt(cal.get('T_e_ms'), 5)} ms; spin "
                f"{fmt(cal.get('spin'))} cycles; in-process candidate "
                f"{fmt(cal.get('inprocess_candidate_ms'), 5)} ms; expected judged speed-up "
                f"{fmt(cal.get('expected_judged_speedup'), 4)}; "
                f"in-process eager / candidate = {fmt(cal.get('inprocess_speedup'), 4)}; "
                f"search points {sum(len(x.get('points') or []) for x in searches)}, "
                f"within 0.5%: {fmt(last.get('converged'))}")
            if cal.get("verification_speedup") is not None:
                lines.append(f"- verification judgement: speed-up "
                             f"{fmt(cal.get('verification_speedup'), 4)} (with the mean of two "
                             f"judged eager times)" + (
                                 f"; retargeted (worker / in-process "
                                 f"{fmt(cal['retarget']['worker_over_inprocess'], 4)})"
                                 if cal.get("retarget") else ""))
            if cal.get("max_abs_error_final") is not None:
                lines.append(f"- max |candidate - eager| at the final spin: "
                             f"{fmt(cal.get('max_abs_error_final'), 3)}")
        if cal.get("error"):
            lines.append(f"- calibration problem: {_cell(cal['error'])}")
        if s.get("n"):
            lines.append(
                f"- judged speed-ups: {fmt_list(s.get('speedup') or [])} (median "
                f"{fmt(s.get('speedup_median'), 4)}, min {fmt(s.get('speedup_min'), 4)}); "
                f"decision flips against the truth: **{s.get('flips')} of "
                f"{s.get('verdicts')}** verdicts (target 0)"
                + (f"; {s['errors']} judgement(s) raised" if s.get("errors") else ""))
        lines.append("")
    lat = data.get("latency")
    if lat:
        summ = lat.get("summary") or {}
        fill = lat.get("fill") or {}
        lines += [
            "### 2. Judge latency (1/40 LayerNorm, baselines cached, the .cu edited before "
            f"each judgement; target <= {LATENCY_TARGET_S:g} s)",
            "",
            f"Cache fill: {fmt(fill.get('seconds'), 4)} s (eager {fmt(fill.get('eager_ms'))} "
            f"ms, compile {fmt(fill.get('compile_ms'))} ms, reward {fmt(fill.get('reward'))})"
            + (f"; error: {_cell(fill['error'])}" if fill.get("error") else ""),
            "",
            "| path | n | median s | all s | median build s | median judge s - build s | "
            "runtime ms | eager ms | rewards | baselines from cache |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for label, kind, key in (("in-process result.seconds", "inprocess", "seconds"),
                                 ("in-process wall", "inprocess", "wall_s"),
                                 ("CLI wall", "cli", "wall_s")):
            s = summ.get(kind) or {}
            values = s.get(key) or []
            lines.append(
                f"| {label} | {len(values)} | {fmt(median(values), 4)} | {fmt_list(values, 3)} "
                f"| {fmt(s.get('build_median'), 3)} | {fmt(s.get('verify_and_time_median'), 3)} "
                f"| {fmt_list(s.get('runtime_ms') or [])} | {fmt_list(s.get('eager_ms') or [])} "
                f"| {fmt_list(s.get('rewards') or [])} | {fmt(s.get('baselines_from_cache'))} |")
        lines += ["", f"Iterations done: {len(lat.get('iterations') or [])} of "
                  f"{lat.get('iterations_planned')}. Target met: in-process "
                  f"{fmt(summ.get('inprocess_target_met'))}, CLI "
                  f"{fmt(summ.get('cli_target_met'))}."]
        if lat.get("error"):
            lines.append(f"\nLatency error: {_cell(lat['error'])}")
        lines.append("")
    if data.get("notes"):
        lines += ["### Notes", ""] + [f"- {_cell(n)}" for n in data["notes"]] + [""]
    return "\n".join(lines) + "\n"


def _cell(text: Any) -> str:
    return str(text).replace("|", "/").replace("\n", " ")[:300]


# ---------------------------------------------------------------------------------------------


def config_sets(parser: argparse.ArgumentParser, sets: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs, each value JSON (a bare word stays a string)."""
    out: dict[str, Any] = {}
    for item in sets:
        key, eq, value = item.partition("=")
        if not eq or not key:
            parser.error(f"--set {item!r}: expected KEY=VALUE")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Judge-v2 GPU benchmark: timing fidelity (repeated judgements, a "
                    "calibrated 1.07x candidate) and judge latency.",
        epilog="Run as: PYTHONPATH=src python3 benchmarks/judge_v2/judge_gpu.py --out $OUT "
               "--kernelbench .bench/kernelbench.jsonl")
    parser.add_argument("--out", type=Path, default=None,
                        help="folder for judge_gpu.json and judge_gpu.md")
    parser.add_argument("--kernelbench", type=Path, default=Path(".bench/kernelbench.jsonl"),
                        help="KernelBench problems (jsonl); default %(default)s")
    parser.add_argument("--budget-s", type=float, default=480.0,
                        help="wall-clock budget for the whole run (default %(default)s)")
    parser.add_argument("--parts", default="fidelity,latency",
                        help="comma-separated parts to run: fidelity, latency "
                             "(default %(default)s)")
    parser.add_argument("--candidates", default="calibrated,1/12,1/40",
                        help="fidelity candidates (default %(default)s)")
    parser.add_argument("--repeats", type=int, default=5,
                        help="judgements per fidelity candidate (default %(default)s)")
    parser.add_argument("--latency-iters", type=int, default=5,
                        help="latency iterations (default %(default)s)")
    parser.add_argument("--fidelity-share", type=float, default=0.55,
                        help="fraction of --budget-s that part 1 may use when both parts run; "
                             "part 2 gets the rest (default %(default)s)")
    parser.add_argument("--spin", type=int, default=None,
                        help="use this CALIBRATED_SPIN instead of calibrating")
    parser.add_argument("--delay", choices=sorted(SEARCH_FROM), default="spin",
                        help="the calibrated candidate's delay: SM clock cycles of busy-waiting "
                        "(spin, follows the SM clock) or 16-byte loads streamed from a scratch "
                        "buffer (stream, follows the memory system as the eager kernels do); "
                        "sets CALIBRATED_DELAY (default %(default)s)")
    parser.add_argument("--calibration-measure-s", type=float, default=0.8,
                        help="time budget of one in-process measurement while calibrating "
                             "(default %(default)s)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="JudgeConfig field for the fidelity judgements (JSON value), "
                             "e.g. --set candidate_processes=3 (repeatable)")
    args = parser.parse_args(argv)
    args.set = config_sets(parser, args.set)
    args.parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    unknown = args.parts - {"fidelity", "latency"}
    if unknown:
        parser.error(f"unknown parts: {', '.join(sorted(unknown))}")
    args.candidates = [c.strip() for c in args.candidates.split(",") if c.strip()]
    bad = set(args.candidates) - set(ROUND_ORDER)
    if bad:
        parser.error(f"unknown candidates: {', '.join(sorted(bad))} (known: "
                     f"{', '.join(ROUND_ORDER)})")
    if not 0 < args.fidelity_share <= 1:
        parser.error("--fidelity-share must be in (0, 1]")
    if args.spin is not None and not 0 <= args.spin <= MAX_SPIN:
        parser.error(f"--spin must be in [0, {MAX_SPIN}]")
    return args


def resolve_kernelbench(path: Path) -> Path:
    if path.is_absolute() or path.exists():
        return path.resolve()
    in_repo = REPO / path
    return in_repo.resolve() if in_repo.exists() else path.resolve()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    start = time.perf_counter()
    budget = Budget(args.budget_s)
    log(f"# judge-v2 GPU benchmark, started "
        f"{datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}")
    home = temp_dir("judge-v2-home-")
    os.environ["CUDA_AGENT_HOME"] = str(home)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    os.environ.pop("CALIBRATED_SPIN", None)
    os.environ["CALIBRATED_DELAY"] = args.delay  # judgements' workers inherit it
    set_python_path()
    report = Report(args.out, sys.argv)
    report.data["delay"] = args.delay
    report.data["budget_s"] = args.budget_s
    report.data["parts"] = sorted(args.parts)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _on_signal)
    try:
        try:
            report.data["dependencies"] = ensure_dependencies()
        except Exception:  # noqa: BLE001
            report.data["dependencies"] = error_record()
        try:
            report.data["environment"] = environment()
        except Exception:  # noqa: BLE001
            report.data["environment"] = error_record()
        log("# Environment")
        for key, value in report.data["environment"].items():
            log(f"  {key}: {value}")
        log(f"  dependencies: {report.data['dependencies']}")
        report.save()
        if not report.data["environment"].get("cuda_available"):
            report.note("torch sees no CUDA device: every judgement will fail")
        kernelbench = resolve_kernelbench(args.kernelbench)
        report.data["kernelbench"] = str(kernelbench)
        if not kernelbench.exists():
            report.note(f"{kernelbench} not found: KernelBench candidates will fail")

        if "fidelity" in args.parts:
            share = args.fidelity_share if "latency" in args.parts else 1.0
            part1 = budget.share(share)
            report.data["fidelity_budget_s"] = part1.seconds
            try:
                fidelity(report, args, part1, kernelbench)
            except Exception:  # noqa: BLE001
                rec = error_record()
                report.data.setdefault("fidelity", {}).update(rec)
                log(rec["traceback"])
            report.save()
        if "latency" in args.parts:
            log("\n# 2. Judge latency (1/40, cached baselines)")
            try:
                latency(report, args, budget, kernelbench)
            except Exception:  # noqa: BLE001
                rec = error_record()
                report.data.setdefault("latency", {}).update(rec)
                log(rec["traceback"])
            report.save()
    except Stop as exc:
        report.note(f"stopped early by {exc}")
    finally:
        report.data["total_s"] = time.perf_counter() - start
        with contextlib.suppress(Exception):
            report.data["gpu_state_end"] = gpu_state()
        report.save()
        for path in TEMP_DIRS:
            shutil.rmtree(path, ignore_errors=True)
        log("\n" + markdown(report.data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
