"""Load benchmark of the judge worker pool (docs/pool.md): throughput and GPU busy time.

    # GPU machine (see device_pool_load.sh, which runs the 1- and 2-GPU cases and the summary)
    python3 benchmarks/execution/pool_load.py --gpus 0 --jobs auto --out OUT --label 1gpu
    python3 benchmarks/execution/pool_load.py --gpus 0,1 --jobs 40 --out OUT --label 2gpu
    python3 benchmarks/execution/pool_load.py --summarize OUT
    # CPU only (tests the logic): the CPU solution of the built-in task, one CPU worker
    python3 benchmarks/execution/pool_load.py --device cpu --gpus '' --jobs 3 --out OUT

The jobs are honest candidates, judged with the default ``JudgeConfig`` (timing on, the
torch.compile baseline on): the built-in ``gelu_bias_scale`` CUDA solution and the three
KernelBench level-1 answers in benchmarks/kernelbench_l1 (problems 10, 12, 40, their tasks
from the KernelBench JSONL), cycled. Every job must come back correct, and every submitted
job exactly once.

Before the measured window a warm-up judges each candidate once through the same pool: this
measures and caches the eager and torch.compile baselines (on disk, shared by the workers and
by later runs), builds the sources, and leaves each worker's judge with warm spare processes.
So the measured load is candidate judging as in RL, where the task's baselines are known.
What is not cached is the candidate's own build: in RL every candidate is new source. A
share ``--fresh`` of the jobs (default one half) is a copy of an answer with a unique comment
in each kernel source, so nvcc compiles it again inside the job; the other jobs reuse a
build. The pool has no separate CPU build workers: the build runs inside the GPU worker's
job (the task's reference runs on the GPU meanwhile), so the GPU waits for nvcc; the report
gives the build time and the other phases per job, fresh and cached apart.

Measured: wall time from the first submit to the last result, jobs/minute and jobs/minute
per GPU, verdict counts, how long each worker held a job (worker occupancy), the judge's
phase times, and the GPU utilisation sampled every 100 ms by ``nvidia-smi --query-gpu=
index,utilization.gpu -lms 100`` (pynvml if nvidia-smi is missing). ``utilization.gpu`` is
the percent of time over the driver's last sample period (1/6 s to 1 s, product dependent)
during which at least one kernel was running on the GPU: it says nothing about how many SMs
were busy, and 100 ms samples overlap. It is reported per GPU as the mean and as the share of
samples above 0, over the window when jobs were queued or running and over the window while
the queue was non-empty (the target: at least 90% busy there).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
KB_DIR = ROOT / "benchmarks" / "kernelbench_l1"
KB_CPU_DIR = ROOT / "benchmarks" / "kernelbench_l1_cpu"
KB_PROBLEMS = {"kb10": (10, "10_3D_tensor_matrix_multiplication"),
               "kb12": (12, "12_Matmul_with_diagonal_matrices_"),
               "kb40": (40, "40_LayerNorm")}
TOP_PHASES = ("build", "reference", "collect_reference", "baselines", "candidate",
              "collect_candidate", "compare", "compare_timed")
STAGES = ("reference.start", "reference.preloaded", "reference.forward", "reference.timing",
          "candidate.start", "candidate.preloaded", "candidate.forward", "candidate.timing")
BUSY_TARGET = 0.90
SCALING_TARGET = 1.8


# --- jobs ----------------------------------------------------------------------------------

def candidates(device: str, mix: list[str], kb: str) -> dict[str, tuple[Any, Path]]:
    """name -> (task, honest candidate folder) for each name of ``mix``."""
    from cuda_agent.tasks import load_task
    from cuda_agent.tasks.loaders import builtin_dir

    found = {}
    for name in mix:
        if name == "gelu":
            found[name] = (load_task("builtin:gelu_bias_scale"),
                           builtin_dir() / "gelu_bias_scale" / "solution" / device)
        elif name in KB_PROBLEMS:
            problem, folder = KB_PROBLEMS[name]
            path = (KB_DIR if device == "cuda" else KB_CPU_DIR) / folder
            if not path.is_dir():
                raise SystemExit(f"{name}: no {device} answer at {path}")
            found[name] = (load_task(f"{kb}::1/{problem}"), path)
        else:
            raise SystemExit(f"unknown candidate {name!r}: gelu, {', '.join(KB_PROBLEMS)}")
    return found


def fresh_copy(source: Path, dest: Path, nonce: str) -> Path:
    """The candidate with a unique comment in every kernel source: its build is not cached."""
    shutil.copytree(source, dest)
    for path in sorted((dest / "kernels").rglob("*")):
        if path.suffix in (".cu", ".cpp"):
            path.write_text(path.read_text() + f"\n// pool load test {nonce}\n")
    return dest


def is_fresh(index: int, share: float) -> bool:
    """Spread ``share`` of the jobs evenly: job i is fresh when floor((i+1)s) > floor(i s)."""
    return int((index + 1) * share + 1e-9) > int(index * share + 1e-9)


# --- sampling ------------------------------------------------------------------------------

class GpuSampler:
    """Utilisation of the given GPUs every ``period_ms``: (monotonic time, index, percent)."""

    def __init__(self, gpus: list[int], period_ms: int):
        self.samples: list[tuple[float, int, float]] = []
        self.source = "none"
        self._stop = threading.Event()
        self._proc: subprocess.Popen | None = None
        self._thread: threading.Thread | None = None
        if not gpus:
            return
        if shutil.which("nvidia-smi"):
            self.source = f"nvidia-smi -lms {period_ms}"
            # each line carries nvidia-smi's own timestamp: its output through a pipe may be
            # buffered, so the time a line is read is not the time it was sampled
            line_buffered = ["stdbuf", "-oL"] if shutil.which("stdbuf") else []
            self._proc = subprocess.Popen(
                [*line_buffered, "nvidia-smi", "--query-gpu=timestamp,index,utilization.gpu",
                 "--format=csv,noheader,nounits", "-lms", str(period_ms),
                 "-i", ",".join(map(str, gpus))],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            self._thread = threading.Thread(target=self._read_smi, daemon=True)
        else:
            try:
                import pynvml  # type: ignore[import-not-found]
            except ImportError:
                return
            self.source = f"pynvml every {period_ms} ms"
            self._thread = threading.Thread(target=self._poll_nvml, args=(pynvml, gpus,
                                                                         period_ms), daemon=True)
        self._thread.start()

    def _read_smi(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        offset = time.time() - time.monotonic()
        for line in self._proc.stdout:
            parts = [p.strip() for p in line.split(",")]
            with contextlib.suppress(ValueError, IndexError):
                try:  # local time, e.g. 2025/01/31 12:00:00.123
                    at = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f"
                                                    ).timestamp() - offset
                except ValueError:
                    at = time.monotonic()
                self.samples.append((at, int(parts[1]), float(parts[2])))

    def _poll_nvml(self, nvml: Any, gpus: list[int], period_ms: int) -> None:
        nvml.nvmlInit()
        handles = {g: nvml.nvmlDeviceGetHandleByIndex(g) for g in gpus}
        while not self._stop.wait(period_ms / 1000):
            now = time.monotonic()
            for g, h in handles.items():
                self.samples.append((now, g, float(nvml.nvmlDeviceGetUtilizationRates(h).gpu)))

    def stop(self) -> None:
        self._stop.set()
        if self._proc is not None:
            self._proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(5)
        if self._thread is not None:
            self._thread.join(5)

    def summary(self, gpus: list[int], start: float, end: float) -> dict[str, Any]:
        out = {}
        for g in gpus:
            values = [u for t, i, u in self.samples if i == g and start <= t <= end]
            out[str(g)] = {"samples": len(values),
                           "mean_util": statistics.fmean(values) / 100 if values else None,
                           "busy_share": (sum(u > 0 for u in values) / len(values)
                                          if values else None)}
        return out


class Monitor:
    """Polls the pool and the handles: when each job was handed out and ended, where it ran,
    and the last moment the queue held a job."""

    def __init__(self, pool: Any, handles: list[Any], places: list[str], period_s: float = 0.01):
        self.pool, self.handles, self.places = pool, handles, places
        self.dispatched: dict[int, float] = {}
        self.finished: dict[int, float] = {}
        self.where: dict[int, str] = {}
        self.last_queued = time.monotonic()
        self.max_running = 0
        self._period = period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _place(self, pid: int) -> str:
        pids = self.pool.worker_pids()
        return self.places[pids.index(pid)] if pid in pids else f"pid{pid}"

    def _run(self) -> None:
        while not self._stop.is_set() and not self._poll():
            self._stop.wait(self._period)

    def _poll(self) -> bool:
        """Record what changed since the last poll; True once every job has ended."""
        now = time.monotonic()
        stats = self.pool.stats()
        if stats.queued:
            self.last_queued = now
        self.max_running = max(self.max_running, stats.running)
        for k, h in enumerate(self.handles):
            if k in self.finished:
                continue
            pid = h.worker_pid
            if pid is not None and k not in self.dispatched:
                self.dispatched[k] = now
                self.where[k] = self._place(pid)
            if h.done():
                self.finished[k] = now
                self.dispatched.setdefault(k, now)
        return len(self.finished) == len(self.handles)

    def stop(self) -> None:
        """Stop polling, then poll once more: the caller may have seen the last result
        before the thread did."""
        self._stop.set()
        self._thread.join(5)
        self._poll()


# --- one case ------------------------------------------------------------------------------

def run_case(args: argparse.Namespace) -> dict[str, Any]:
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # nvidia-smi's numbering
    from cuda_agent.execution import JobFailed, JudgePool, PoolConfig
    from cuda_agent.judge import JudgeConfig
    from cuda_agent.results import JudgeResult

    began = time.monotonic()
    gpus = [int(g) for g in args.gpus.split(",") if g.strip()]
    device = args.device
    mix = [m for m in args.mix.split(",") if m] if args.mix else (
        ["gelu", "kb40", "kb12", "kb10"] if device == "cuda" else ["gelu"])
    found = candidates(device, mix, args.kb)
    judge = JudgeConfig(device=device)
    if args.time_budget_s is not None:
        judge = judge.model_copy(update={"time_budget_s": args.time_budget_s})
    per_gpu = args.jobs_per_gpu
    pool_cfg = PoolConfig(gpus=gpus, cpu_workers=args.cpu_workers, judge=judge,
                          job_timeout_s=args.job_timeout_s, retries=1, jobs_per_gpu=per_gpu)
    places = [f"gpu{g}" if per_gpu == 1 else f"gpu{g}.{i}" for g in gpus
              for i in range(per_gpu)] or [f"cpu{k}" for k in range(args.cpu_workers)]
    workers = len(places)
    units = len(gpus) or workers  # GPUs, or CPU workers
    scratch = Path(tempfile.mkdtemp(prefix="pool-load-"))
    run_id = f"{args.label}-{uuid.uuid4().hex[:8]}"
    report: dict[str, Any] = {
        "label": args.label, "device": device, "gpus": gpus, "workers": workers, "mix": mix,
        "fresh_share": args.fresh, "judge": judge.model_dump(mode="json"),
        "machine": machine(gpus)}
    print(f"== {args.label}: {workers} worker(s) on {places}, mix {mix}, "
          f"fresh builds {args.fresh:.0%}", flush=True)

    with JudgePool(pool_cfg) as pool:
        # warm-up 1: each answer as it is (builds cached, baselines measured and cached)
        names = [mix[k % len(mix)] for k in range(max(len(mix), workers))]
        t = time.monotonic()
        warm = pool.map([found[n] for n in names], timeout=args.budget_s)
        report["warmup_s"] = round(time.monotonic() - t, 1)
        report["warmup"] = [brief(n, r) for n, r in zip(names, warm, strict=True)]
        print(f"   warm-up ({len(names)} jobs: baselines, builds, warm spares) "
              f"{report['warmup_s']} s", flush=True)
        bad = [(n, reason(r)) for n, r in zip(names, warm, strict=True) if not ok(r)]
        if bad:
            report["error"] = f"warm-up failed: {bad}"
            return report
        # warm-up 2 (when J is chosen here): fresh copies, to estimate the time of a job
        jobs = args.jobs
        if jobs == "auto":
            copies = [fresh_copy(found[n][1], scratch / f"cal{k}_{n}", f"{run_id}-cal{k}")
                      for k, n in enumerate(names)]
            t = time.monotonic()
            cal = pool.map([(found[n][0], c) for n, c in zip(names, copies, strict=True)],
                           timeout=args.budget_s)
            report["calibration_s"] = round(time.monotonic() - t, 1)
            if not all(ok(r) for r in cal):
                report["error"] = f"calibration failed: {[reason(r) for r in cal]}"
                return report
            per_fresh = statistics.fmean(r.seconds for r in cal)
            per_build = statistics.fmean(dict(r.phases).get("build", 0.0) for r in cal)
            per_job = per_fresh - (1 - args.fresh) * per_build
            left = args.budget_s - (time.monotonic() - began) - 30
            window = max(10.0, min(args.window_s, left / 1.4))
            jobs = max(2 * workers, min(args.max_jobs, round(window * workers / per_job)))
            report["estimate"] = {"job_s": round(per_job, 2), "fresh_job_s": round(per_fresh, 2),
                                  "build_s": round(per_build, 2), "window_s": round(window, 1)}
            print(f"   calibration {report['calibration_s']} s: a fresh job {per_fresh:.1f} s "
                  f"(build {per_build:.1f} s); {jobs} jobs for a ~{window:.0f} s window",
                  flush=True)
        jobs = int(jobs)
        plan = []
        for k in range(jobs):
            name = mix[k % len(mix)]
            fresh = is_fresh(k, args.fresh)
            path = (fresh_copy(found[name][1], scratch / f"j{k}_{name}", f"{run_id}-{k}")
                    if fresh else found[name][1])
            plan.append((name, fresh, path))
        report["jobs"] = jobs

        # the measured window
        sampler = GpuSampler(gpus, args.sample_ms)
        time.sleep(1.5 if gpus else 0.0)  # nvidia-smi's start
        before = pool.stats()
        t0 = time.monotonic()
        handles = [pool.submit(found[name][0], path) for name, _, path in plan]
        monitor = Monitor(pool, handles, places)
        deadline = began + args.budget_s - 20
        results: list[Any] = []
        for h in handles:
            try:
                results.append(h.result(timeout=max(1.0, deadline - time.monotonic())))
            except TimeoutError:
                results.append(None)
        incomplete = sum(r is None for r in results)
        if incomplete:
            pool.close()  # what is left ends as JobFailed('pool closed')
            results = [h.result(timeout=30) for h in handles]
        monitor.stop()
        time.sleep(1.0)  # the last samples of the window
        sampler.stop()
        after = pool.stats()
    shutil.rmtree(scratch, ignore_errors=True)

    # jobs cut by the budget count neither as done nor in the window's rate
    completed = [k for k, r in enumerate(results) if not (isinstance(r, JobFailed)
                                                          and "pool closed" in r.reason)]
    t_end = max((monitor.finished[k] for k in completed if k in monitor.finished),
                default=time.monotonic())
    t_drain = min(max(monitor.last_queued, t0), t_end)
    window_s = t_end - t0
    ids = [h.id for h in handles]
    checks = {
        "ids_unique": len(set(ids)) == len(ids),
        "every_job_ended": all(h.done() for h in handles) and not incomplete,
        "results_match_tasks": all(isinstance(r, JobFailed | JudgeResult) and r.task
                                   == found[name][0].name for r, (name, _, _) in
                                   zip(results, plan, strict=True)),
        "pool_counts": (after.done + after.failed - before.done - before.failed == jobs
                        and after.queued == 0 and after.running == 0),
        "all_correct": all(ok(r) for r in results),
        "no_worker_replaced": after.replaced == before.replaced,
    }
    verdicts: dict[str, dict[str, int]] = {}
    for r, (name, _, _) in zip(results, plan, strict=True):
        kind = ("correct" if ok(r) else "failed job" if isinstance(r, JobFailed)
                else "wrong verdict")
        verdicts.setdefault(name, {}).setdefault(kind, 0)
        verdicts[name][kind] += 1
    held = {p: 0.0 for p in places}
    for k in range(jobs):
        place = monitor.where.get(k)
        if place in held and k in monitor.finished:
            held[place] += monitor.finished[k] - monitor.dispatched[k]
    report.update({
        "window_s": round(window_s, 2), "queue_drained_after_s": round(t_drain - t0, 2),
        "completed": len(completed), "cut_by_budget": jobs - len(completed),
        "jobs_per_min": round(len(completed) / window_s * 60, 2),
        "jobs_per_min_per_gpu": round(len(completed) / window_s * 60 / units, 2),
        "jobs_per_gpu": per_gpu,
        # the share of the window in which each GPU's turn (JudgeConfig.gpu_lock) was held;
        # with one worker per GPU there is no lock: the worker's occupancy stands for it
        "gpu_turn_share": round(sum(dict(r.phases).get("gpu_held", 0.0) for r in results
                                    if r is not None and hasattr(r, "phases"))
                                / (window_s * units), 3) if per_gpu > 1 else None,
        "checks": checks, "ok": all(checks.values()) and window_s > 0,
        "verdicts": verdicts,
        "failures": [f"job {k} {plan[k][0]}: {reason(r)[:300]}"
                     for k, r in enumerate(results) if not ok(r)][:10],
        "worker_occupancy": {p: round(v / window_s, 3) for p, v in held.items()},
        "max_running": monitor.max_running, "replaced": after.replaced - before.replaced,
        "util_source": sampler.source,
        "util_while_running": sampler.summary(gpus, t0, t_end),
        "util_while_queued": sampler.summary(gpus, t0, t_drain),
        "phases": {"fresh": phase_means([r for r, p in zip(results, plan, strict=True)
                                         if p[1] and isinstance(r, JudgeResult)]),
                   "cached": phase_means([r for r, p in zip(results, plan, strict=True)
                                          if not p[1] and isinstance(r, JudgeResult)])},
        "held_s_mean": round(statistics.fmean(
            [monitor.finished[k] - monitor.dispatched[k] for k in monitor.finished]) if
            monitor.finished else 0.0, 2),
        "per_job": [{"name": name, "fresh": fresh, "place": monitor.where.get(k),
                     "dispatched_s": round(monitor.dispatched.get(k, t0) - t0, 2),
                     "finished_s": round(monitor.finished.get(k, t_end) - t0, 2),
                     **brief(name, r)} for k, (r, (name, fresh, _)) in
                    enumerate(zip(results, plan, strict=True))],
        "total_s": round(time.monotonic() - began, 1),
    })
    return report


def ok(result: Any) -> bool:
    from cuda_agent.results import JudgeResult

    return isinstance(result, JudgeResult) and result.correct


def reason(result: Any) -> str:
    from cuda_agent.results import JudgeResult

    if isinstance(result, JudgeResult):
        return " | ".join(result.reasons) or ("correct" if result.correct else "incorrect")
    return getattr(result, "reason", repr(result))


def brief(name: str, result: Any) -> dict[str, Any]:
    from cuda_agent.results import JudgeResult

    if not isinstance(result, JudgeResult):
        return {"name": name, "ok": False, "reason": reason(result)[:500]}
    phases = dict(result.phases)
    return {"name": name, "ok": result.correct, "reward": result.reward,
            "seconds": round(result.seconds, 3), "build_s": round(phases.get("build", 0.0), 3),
            "compiled": list(result.build.compiled) if result.build else [],
            "speedup_vs_eager": result.speedup_vs_eager,
            "reason": "" if result.correct else reason(result)[:500]}


def phase_means(results: list[Any]) -> dict[str, Any]:
    """Mean seconds per job of the judge's phases, the stages of its worker processes, and
    the rest of the judge's wall time."""
    if not results:
        return {}
    table = {"jobs": len(results),
             "judge_s": round(statistics.fmean(r.seconds for r in results), 3)}
    for key in (*TOP_PHASES, *STAGES):
        table[key] = round(statistics.fmean(dict(r.phases).get(key, 0.0) for r in results), 3)
    table["other"] = round(table["judge_s"] - sum(table[k] for k in TOP_PHASES), 3)
    return table


def machine(gpus: list[int]) -> dict[str, Any]:
    info: dict[str, Any] = {"cpus": os.cpu_count(), "python": sys.version.split()[0]}
    with contextlib.suppress(Exception):
        import torch

        info["torch"] = torch.__version__
    if gpus and shutil.which("nvidia-smi"):
        with contextlib.suppress(Exception):
            info["gpu"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=index,name,memory.total", "--format=csv,noheader",
                 f"--id={','.join(map(str, gpus))}"], capture_output=True, text=True,
                timeout=30).stdout.strip().splitlines()
    return info


# --- reports -------------------------------------------------------------------------------

def pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0%}"


def case_markdown(r: dict[str, Any]) -> str:
    if "window_s" not in r:
        return f"### {r['label']}\n\nnot measured: {r.get('error', 'unknown error')}\n"
    checks = r["checks"].items()
    lines = [f"### {r['label']}: {r['workers']} worker(s) ({r['device']}), {r['jobs']} jobs, "
             f"mix {', '.join(r['mix'])}, fresh builds {r['fresh_share']:.0%}", "",
             "| metric | value |", "|---|---|",
             f"| window (first submit to last result) | {r['window_s']:.1f} s |",
             f"| queue non-empty for | {r['queue_drained_after_s']:.1f} s |",
             f"| jobs/min | {r['jobs_per_min']:.1f} |",
             f"| jobs/min per {'GPU' if r['gpus'] else 'worker'} | "
             f"{r['jobs_per_min_per_gpu']:.1f} |",
             f"| warm-up (not measured) | {r.get('warmup_s', 0)} s"
             f"{', calibration ' + str(r['calibration_s']) + ' s' if 'calibration_s' in r else ''}"
             " |",
             f"| verdicts | {json.dumps(r['verdicts'])} |",
             f"| checks | {', '.join(k + ('=ok' if v else '=FAIL') for k, v in checks)} |",
             f"| worker occupancy (held a job / window) | "
             f"{', '.join(f'{p} {pct(v)}' for p, v in r['worker_occupancy'].items())} |",
             f"| mean time a worker held a job | {r['held_s_mean']:.2f} s |"]
    if r["gpus"]:
        lines += ["", f"GPU utilisation ({r['util_source']}; utilization.gpu = share of the "
                  "sample period in which any kernel ran, not SM occupancy):", "",
                  "| GPU | window | samples | mean util | samples with util > 0 |",
                  "|---|---|---|---|---|"]
        for name, key in (("queue non-empty", "util_while_queued"),
                          ("jobs queued or running", "util_while_running")):
            for g, u in r[key].items():
                lines.append(f"| {g} | {name} | {u['samples']} | {pct(u['mean_util'])} | "
                             f"{pct(u['busy_share'])} |")
    keys = [k for k in ("judge_s", *TOP_PHASES, "other", *STAGES)
            if any(r["phases"][c].get(k) for c in ("fresh", "cached"))]
    lines += ["", "Judge phases, mean seconds per job (build, compare and the worker "
              "processes' start-up run on the CPU; reference and candidate are the GPU "
              "parts; `x.start` = a worker's interpreter start-up, `x.preloaded` = it "
              "waited for its job):", "",
              "| phase | fresh build | cached build |", "|---|---|---|"]
    for k in keys:
        cells = [str(r["phases"][c].get(k, "")) for c in ("fresh", "cached")]
        lines.append(f"| {k} | {cells[0]} | {cells[1]} |")
    for c in ("fresh", "cached"):
        p = r["phases"][c]
        if p and p.get("judge_s"):
            gpu_side = sum(p[k] for k in ("reference", "candidate", "compare", "compare_timed"))
            lines.append(f"\n{c} ({p['jobs']} jobs): build {p['build'] / p['judge_s']:.0%} of "
                         f"the judge's time per job; the phases that use the GPU (reference, "
                         f"candidate, compare) {gpu_side / p['judge_s']:.0%}, of which worker "
                         f"start-up waits and the candidate's load are CPU time")
    if r["failures"]:
        lines += ["", "Failures:", *(f"- {f}" for f in r["failures"])]
    return "\n".join(lines) + "\n"


def summary_markdown(cases: list[dict[str, Any]]) -> str:
    lines = ["## Judge pool load", "",
             "| case | workers | jobs | window s | jobs/min | jobs/min/GPU | GPU turn held | "
             "GPU util (queue non-empty) | util > 0 (queue non-empty) | all correct, "
             "none lost |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in cases:
        if "window_s" not in r:
            lines.append(f"| {r['label']} | {r.get('workers')} | - | - | - | - | - | - | - | "
                         f"FAILED: {r.get('error', '')[:200]} |")
            continue
        util = r["util_while_queued"]
        mean = ", ".join(pct(u["mean_util"]) for u in util.values()) or "n/a"
        busy = ", ".join(pct(u["busy_share"]) for u in util.values()) or "n/a"
        lines.append(f"| {r['label']} | {r['workers']} | {r['jobs']} | {r['window_s']:.1f} | "
                     f"{r['jobs_per_min']:.1f} | {r['jobs_per_min_per_gpu']:.1f} | "
                     f"{pct(r['gpu_turn_share']) if r.get('gpu_turn_share') is not None else '-'}"
                     f" | {mean} | "
                     f"{busy} | {'yes' if r['ok'] else 'NO'} |")
    done = [r for r in cases if "window_s" in r and r["gpus"]]
    one = next((r for r in done if len(r["gpus"]) == 1), None)
    two = next((r for r in done if len(r["gpus"]) == 2), None)
    lines.append("")
    for r in done:
        worst = min((u["mean_util"] or 0.0) for u in r["util_while_queued"].values())
        lines.append(f"- {r['label']}: lowest mean GPU utilisation while the queue was "
                     f"non-empty {worst:.0%} (target {BUSY_TARGET:.0%}: "
                     f"{'met' if worst >= BUSY_TARGET else 'NOT met'})")
        if r.get("gpu_turn_share") is not None:
            lines.append(f"- {r['label']}: each GPU's turn (its lock) held "
                         f"{r['gpu_turn_share']:.0%} of the window (target {BUSY_TARGET:.0%}: "
                         f"{'met' if r['gpu_turn_share'] >= BUSY_TARGET else 'NOT met'})")
    if one and two:
        ratio = two["jobs_per_min"] / one["jobs_per_min"]
        cut = [r["label"] for r in (one, two) if r.get("cut_by_budget")]
        verdict = ("NOT valid: jobs cut by the budget in " + ", ".join(cut) if cut else
                   "met" if ratio >= SCALING_TARGET else "NOT met")
        lines.append(f"- scaling 2 GPUs / 1 GPU: {ratio:.2f}x (target {SCALING_TARGET}x: "
                     f"{verdict}; same {two['jobs']} jobs)")
    return "\n".join(lines) + "\n"


SUMMARY_KEYS = ("label", "gpus", "workers", "jobs", "completed", "cut_by_budget", "window_s",
                "jobs_per_min", "jobs_per_min_per_gpu", "gpu_turn_share", "ok",
                "util_while_queued", "error")


def summarize(out: Path) -> int:
    cases = [json.loads(p.read_text()) for p in sorted(out.glob("pool_load_*.json"))]
    cases.sort(key=lambda r: len(r.get("gpus", [])))
    # a case carried from an earlier call's summary (CASE1) has no details to print
    text = summary_markdown(cases) + "\n" + "\n".join(case_markdown(r) for r in cases
                                                        if "phases" in r)
    (out / "pool_load.md").write_text(text)
    summary = {"cases": {r["label"]: {k: r.get(k) for k in SUMMARY_KEYS} for r in cases}}
    by_gpus = {len(r.get("gpus", [])): r for r in cases if "window_s" in r}
    if 1 in by_gpus and 2 in by_gpus:
        summary["scaling_2_over_1"] = round(by_gpus[2]["jobs_per_min"]
                                            / by_gpus[1]["jobs_per_min"], 3)
    (out / "pool_load.json").write_text(json.dumps(summary, indent=2))
    print(text)
    return 0 if cases and all(r.get("ok") for r in cases) else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--gpus", default="0", help="GPU indices, comma separated; '' none")
    parser.add_argument("--cpu-workers", type=int, default=1)
    parser.add_argument("--jobs-per-gpu", type=int, default=1,
                        help="judge workers per GPU (PoolConfig.jobs_per_gpu)")
    parser.add_argument("--jobs", default="auto", help="number of jobs, or 'auto': sized "
                        "from a calibration round so the window lasts about --window-s")
    parser.add_argument("--window-s", type=float, default=110.0)
    parser.add_argument("--max-jobs", type=int, default=400)
    parser.add_argument("--budget-s", type=float, default=320.0,
                        help="the whole run, warm-up included; jobs not done by then fail")
    parser.add_argument("--fresh", type=float, default=0.5,
                        help="share of jobs whose sources are new (built inside the job)")
    parser.add_argument("--mix", default="", help="candidates, comma separated: gelu, kb10, "
                        "kb12, kb40 (default: all four on cuda, gelu on cpu)")
    parser.add_argument("--kb", default=str(ROOT / ".bench" / "kernelbench.jsonl"))
    parser.add_argument("--time-budget-s", type=float, default=None,
                        help="the judge's timing budget per measurement (default: its own)")
    parser.add_argument("--job-timeout-s", type=float, default=300.0)
    parser.add_argument("--sample-ms", type=int, default=100)
    parser.add_argument("--label", default="")
    parser.add_argument("--out", type=Path, default=Path("/tmp/pool_load"))
    parser.add_argument("--summarize", type=Path, default=None, metavar="OUT",
                        help="combine the cases in OUT into OUT/pool_load.md and .json")
    args = parser.parse_args()
    if args.summarize:
        return summarize(args.summarize)
    if args.jobs != "auto" and not args.jobs.isdigit():
        parser.error("--jobs: a number or 'auto'")
    if not 0.0 <= args.fresh <= 1.0:
        parser.error("--fresh: between 0 and 1")
    if args.device == "cuda" and not args.gpus.strip():
        parser.error("--device cuda needs --gpus")
    if args.device == "cpu":
        args.gpus = ""
    args.label = args.label or (f"{len(args.gpus.split(','))}gpu" if args.gpus else "cpu")
    args.out.mkdir(parents=True, exist_ok=True)
    report = run_case(args)
    (args.out / f"pool_load_{args.label}.json").write_text(json.dumps(report, indent=2))
    text = case_markdown(report)
    (args.out / f"pool_load_{args.label}.md").write_text(text)
    print(text, flush=True)
    return 0 if report.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
