"""Load benchmark of the judge worker pool (docs/pool.md): throughput and GPU busy time.

    # GPU machine (see device_pool_load.sh: one GPU with 1 and 3 workers, and the summary)
    python3 benchmarks/execution/pool_load.py --gpus 0 --jobs-per-gpu 3 --jobs window \
        --window-s 60 --out OUT --label 1gpu-x3
    python3 benchmarks/execution/pool_load.py --gpus 0,1 --jobs 40 --out OUT --label 2gpu
    python3 benchmarks/execution/pool_load.py --gpus 0,1 --backend ray --out OUT --label ray2
    python3 benchmarks/execution/pool_load.py --summarize OUT
    # CPU only (tests the logic): the CPU solution of the built-in task; with --cpu-lock two
    # CPU workers share one GPU turn, as the judges on one GPU do
    python3 benchmarks/execution/pool_load.py --device cpu --gpus '' --jobs 3 --out OUT
    python3 benchmarks/execution/pool_load.py --device cpu --gpus '' --cpu-workers 2 \
        --cpu-lock --jobs window --window-s 60 --out OUT

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

Measured: wall time from the first submit to the last result, jobs/minute, jobs/minute
per GPU and jobs per GPU-hour (with ``--jobs window`` also over the time jobs were kept
queued, before the drain), verdict counts, how the GPU's turn was held (from the judges'
log of it, ``gpu_turn.LOG_ENV``: the share of the window held exclusive, held at all,
held shared only, with a worker's timed calls running, and the mean number of shared
holders), how long each worker held a job (worker occupancy), the judge's
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
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from pool_load_report import GPU_PHASES, STAGES, TOP_PHASES, case_markdown, summarize
from pool_load_watch import GpuSampler, Monitor, turn_shares

ROOT = Path(__file__).resolve().parents[2]
KB_DIR = ROOT / "benchmarks" / "kernelbench_l1"
KB_CPU_DIR = ROOT / "benchmarks" / "kernelbench_l1_cpu"
KB_PROBLEMS = {"kb10": (10, "10_3D_tensor_matrix_multiplication"),
               "kb12": (12, "12_Matmul_with_diagonal_matrices_"),
               "kb40": (40, "40_LayerNorm")}


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


def feed(pool: Any, found: dict[str, tuple[Any, Path]], make: Any, plan: list, handles: list,
         depth: int, until: float) -> float:
    """Keep ``depth`` jobs queued or running until ``until`` (monotonic), each new one made
    by ``make(k)`` and added to ``plan`` and ``handles``; returns when it stopped."""
    while time.monotonic() < until:
        running = sum(not h.done() for h in handles)
        for _ in range(depth - running):
            plan.append(make(len(plan)))
            handles.append(pool.submit(found[plan[-1][0]][0], plan[-1][2]))
        time.sleep(0.05)
    return time.monotonic()


def is_fresh(index: int, share: float) -> bool:
    """Spread ``share`` of the jobs evenly: job i is fresh when floor((i+1)s) > floor(i s)."""
    return int((index + 1) * share + 1e-9) > int(index * share + 1e-9)


# (sampling: pool_load_watch.py; reports: pool_load_report.py)

# --- one case ------------------------------------------------------------------------------

def run_case(args: argparse.Namespace) -> dict[str, Any]:
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # nvidia-smi's numbering
    from cuda_agent.execution import JobFailed, PoolConfig, make_pool
    from cuda_agent.judge import JudgeConfig
    from cuda_agent.judge.gpu_turn import LOG_ENV
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
    if args.baseline_processes is not None:
        judge = judge.model_copy(update={"baseline_processes": args.baseline_processes})
    if args.candidate_processes is not None:
        judge = judge.model_copy(update={"candidate_processes": args.candidate_processes})
    if args.cpu_lock and device == "cpu":  # the CPU workers share one turn, as on a GPU
        judge = judge.model_copy(update={"gpu_lock": str(args.out / f"{args.label}.lock")})
    per_gpu = args.jobs_per_gpu
    turn_log = None
    if judge.gpu_lock or (gpus and per_gpu > 1):
        turn_log = args.out / f"pool_load_{args.label}_turns.jsonl"
        turn_log.unlink(missing_ok=True)
        os.environ[LOG_ENV] = str(turn_log)  # the pool's workers inherit it
    pool_cfg = PoolConfig(gpus=gpus, cpu_workers=args.cpu_workers, judge=judge,
                          job_timeout_s=args.job_timeout_s, retries=1, jobs_per_gpu=per_gpu,
                          backend=args.backend)
    places = [f"gpu{g}" if per_gpu == 1 else f"gpu{g}.{i}" for g in gpus
              for i in range(per_gpu)] or [f"cpu{k}" for k in range(args.cpu_workers)]
    workers = len(places)
    units = len(gpus) or workers  # GPUs, or CPU workers
    scratch = Path(tempfile.mkdtemp(prefix="pool-load-"))
    run_id = f"{args.label}-{uuid.uuid4().hex[:8]}"
    report: dict[str, Any] = {
        "label": args.label, "device": device, "gpus": gpus, "workers": workers, "mix": mix,
        "backend": args.backend,
        "fresh_share": args.fresh, "judge": judge.model_dump(mode="json"),
        "machine": machine(gpus)}
    print(f"== {args.label}: {workers} worker(s) on {places}, mix {mix}, "
          f"fresh builds {args.fresh:.0%}", flush=True)

    with make_pool(pool_cfg) as pool:
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
        def make(k: int) -> tuple[str, bool, Path]:
            name, fresh = mix[k % len(mix)], is_fresh(k, args.fresh)
            return name, fresh, (fresh_copy(found[name][1], scratch / f"j{k}_{name}",
                                            f"{run_id}-{k}") if fresh else found[name][1])

        plan = [make(k) for k in range(0 if jobs == "window" else int(jobs))]

        # the measured window
        sampler = GpuSampler(gpus, args.sample_ms)
        time.sleep(1.5 if gpus else 0.0)  # nvidia-smi's start
        before = pool.stats()
        t0 = time.monotonic()
        handles = [pool.submit(found[name][0], path) for name, _, path in plan]
        monitor = Monitor(pool, handles, places)
        deadline = began + args.budget_s - 20
        t_fed = t0
        if jobs == "window":  # jobs kept 2 per worker ahead until the window ends
            t_fed = feed(pool, found, make, plan, handles, 2 * workers,
                         min(t0 + args.window_s, deadline - args.drain_s))
        report["jobs"] = len(plan)
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
    jobs = len(plan)
    fed = [k for k in completed if monitor.finished.get(k, t_end) <= t_fed]
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
        "jobs_per_gpu_hour": round(len(completed) / window_s * 3600 / units, 1),
        # jobs kept queued all along (``--jobs window``): the rate before the drain
        "fed_s": round(t_fed - t0, 2) if t_fed > t0 else None,
        "jobs_per_gpu_hour_fed": round(len(fed) / (t_fed - t0) * 3600 / units, 1)
        if t_fed > t0 else None,
        "jobs_per_gpu": per_gpu,
        # how each GPU's turn (JudgeConfig.gpu_lock) was held over the window, from the
        # judges' log; with one worker per GPU there is no lock: its occupancy stands for it
        "turn": turn_shares(turn_log, t0, t_end) if turn_log is not None else {},
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
    for key in (*TOP_PHASES, *GPU_PHASES, *STAGES):
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--gpus", default="0", help="GPU indices, comma separated; '' none")
    parser.add_argument("--cpu-workers", type=int, default=1)
    parser.add_argument("--jobs-per-gpu", type=int, default=1,
                        help="judge workers per GPU (PoolConfig.jobs_per_gpu)")
    parser.add_argument("--jobs", default="auto", help="number of jobs; 'auto': sized "
                        "from a calibration round so the window lasts about --window-s; "
                        "'window': jobs kept two per worker ahead for --window-s, then "
                        "drained")
    parser.add_argument("--window-s", type=float, default=110.0)
    parser.add_argument("--drain-s", type=float, default=30.0,
                        help="with --jobs window: time left for the last jobs to end")
    parser.add_argument("--cpu-lock", action="store_true",
                        help="CPU only: the CPU workers share one GPU turn (tests the "
                        "turn's figures without a GPU)")
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
    parser.add_argument("--baseline-processes", type=int, default=None,
                        help="the judge's processes per baseline (default: its own; 1 makes "
                        "the warm-up that caches the baselines shorter)")
    parser.add_argument("--candidate-processes", type=int, default=None,
                        help="the judge's processes each candidate is timed in (default: "
                        "its own, 8 on CUDA)")
    parser.add_argument("--job-timeout-s", type=float, default=300.0)
    parser.add_argument("--sample-ms", type=int, default=100)
    parser.add_argument("--backend", choices=("local", "ray"), default="local",
                        help="the pool's backend (PoolConfig.backend): worker processes, or "
                        "Ray actors (a Ray instance started on this machine)")
    parser.add_argument("--label", default="")
    parser.add_argument("--out", type=Path, default=Path("/tmp/pool_load"))
    parser.add_argument("--summarize", type=Path, default=None, metavar="OUT",
                        help="combine the cases in OUT into OUT/pool_load.md and .json")
    args = parser.parse_args()
    if args.summarize:
        return summarize(args.summarize)
    if args.jobs not in ("auto", "window") and not args.jobs.isdigit():
        parser.error("--jobs: a number, 'auto' or 'window'")
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
