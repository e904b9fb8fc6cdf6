"""Foundation benchmark on a CUDA GPU: incremental rebuild times and judge verdicts.

Run from the repository root on the GPU machine:

    PYTHONPATH=src python3 benchmarks/foundation_gpu.py --out $OUT

1. Rebuilds. With a fresh CUDA_AGENT_HOME in a temporary folder, a copy of one candidate
   workspace (default benchmarks/kernelbench_l1/40_LayerNorm) is built with
   ``Builder(BuildConfig(device="cuda"))``: the cold build (which includes the one-off compile
   of the torch binding layer), no-change rebuilds, then --edits rebuilds each after editing
   the kernel's .cu file, and --edits more after editing its *_binding.cpp. Each edit appends a
   new comment line and changes the value of a constant, so the content hash changes. Every
   build's ``BuildResult.seconds`` is kept. The same kinds of build are then timed as wall
   time through the command line, ``python3 -m cuda_agent.cli.main workspace build DIR``, in a
   workspace made by ``workspace init`` for the same task whose kernels/ and model_new.py are
   replaced by the candidate's; a missing or failing command line is reported, not fatal.
2. Judge. For each of the three candidates in benchmarks/kernelbench_l1, runs
   ``python3 -m cuda_agent.cli.main judge KERNELBENCH::1/ID DIR --device cuda --json`` on a
   copy of the candidate and keeps its JSON verdict.
   Where the KernelBench copy is absent, --tasks DIR names a folder of task files instead:
   DIR/<candidate folder>.py is used as the task of that candidate.
3. Prints the environment first and a Markdown summary last, and writes the full JSON
   (foundation_gpu.json) and the summary (foundation_gpu.md) to --out.

Every step is guarded, so one failure loses nothing else, and the whole run keeps to
--budget-s seconds (default 470) by shortening or skipping what would overrun.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
CANDIDATES_DIR = REPO / "benchmarks" / "kernelbench_l1"
# (KernelBench level-1 problem id, candidate folder)
PROBLEMS = (
    (12, "12_Matmul_with_diagonal_matrices_"),
    (40, "40_LayerNorm"),
    (10, "10_3D_tensor_matrix_multiplication"),
)
JUDGE_KEYS = ("task", "device", "compiled", "correct", "reward", "reasons", "runtime_ms",
              "eager_ms", "compile_ms", "speedup_vs_eager", "speedup_vs_compile")
CLI_MODULE = "cuda_agent.cli.main"
TEMP_DIRS: list[Path] = []

if str(REPO / "src") not in sys.path and importlib.util.find_spec("cuda_agent") is None:
    sys.path.insert(0, str(REPO / "src"))


class Budget:
    """Wall-clock budget for the whole run."""

    def __init__(self, seconds: float):
        self.deadline = time.monotonic() + seconds

    def left(self) -> float:
        return self.deadline - time.monotonic()


def temp_dir(prefix: str) -> Path:
    path = Path(tempfile.mkdtemp(prefix=prefix))
    TEMP_DIRS.append(path)
    return path


def log(msg: str) -> None:
    print(msg, flush=True)


def tail(text: str | bytes | None, n: int = 2000) -> str:
    if text is None:
        return ""
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return text[-n:]


def summary(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0, "median": None, "min": None, "max": None}
    return {"n": len(values), "median": statistics.median(values), "min": min(values),
            "max": max(values)}


def fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


# ---------------------------------------------------------------------------------------------
# Environment


def environment() -> dict[str, Any]:
    info: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "python": sys.version.split()[0],
        "cuda_agent_home": os.environ.get("CUDA_AGENT_HOME"),
    }
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
    except Exception as exc:  # noqa: BLE001 - report, never stop
        info["torch_error"] = repr(exc)
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        cuda_home = os.environ.get("CUDA_HOME") or "/usr/local/cuda"
        candidate = Path(cuda_home) / "bin" / "nvcc"
        nvcc = str(candidate) if candidate.exists() else None
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
        import cuda_agent

        info["cuda_agent"] = getattr(cuda_agent, "__version__", "?")
    except Exception as exc:  # noqa: BLE001
        info["cuda_agent"] = f"import failed: {exc!r}"
    return info


# ---------------------------------------------------------------------------------------------
# Part 1: rebuilds


def edited(original: str, i: int, tag: str) -> str:
    """The original source plus a new comment line and a constant whose value changes."""
    return (f"{original.rstrip()}\n// foundation benchmark edit {tag} {i}: "
            f"{time.time_ns()}\n[[maybe_unused]] static constexpr int kFoundationEdit = "
            f"{1000 + i};\n")


def build_once(builder: Any, ws: Path) -> dict[str, Any]:
    start = time.perf_counter()
    result = builder.build(ws)
    wall = time.perf_counter() - start
    rec = {"ok": result.ok, "seconds": result.seconds, "wall_s": wall,
           "compiled": list(result.compiled), "cached": list(result.cached)}
    if not result.ok:
        rec["errors"] = [str(d) for d in result.diagnostics][:10]
        rec["log"] = tail(result.log, 3000)
    return rec


def cli_build_once(ws: Path, timeout: float) -> dict[str, Any]:
    cmd = [sys.executable, "-m", CLI_MODULE, "workspace", "build", str(ws), "--json"]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=max(timeout, 1),
                              check=False, env=child_env())
    except subprocess.TimeoutExpired as exc:
        return {"ok": False, "wall_s": time.perf_counter() - start, "rc": None,
                "error": f"timed out after {timeout:.0f} s", "stderr": tail(exc.stderr)}
    rec: dict[str, Any] = {"ok": proc.returncode == 0, "wall_s": time.perf_counter() - start,
                           "rc": proc.returncode}
    result = parse_json_output(proc.stdout)
    if result:
        rec["seconds"] = result.get("seconds")
        rec["compiled"] = result.get("compiled")
        rec["cached"] = result.get("cached")
    if proc.returncode != 0:
        rec["stdout"] = tail(proc.stdout)
        rec["stderr"] = tail(proc.stderr)
    return rec


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    src = str(REPO / "src")
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([src, *(p for p in parts if p != src)])
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def series(name: str, runs: list[dict[str, Any]], key: str) -> dict[str, Any]:
    values = [r[key] for r in runs if r.get("ok") and r.get(key) is not None]
    inner = [r["seconds"] for r in runs if r.get("ok") and r.get("seconds") is not None]
    return {"series": name, "key": key, "runs": runs, "ok": sum(bool(r.get("ok")) for r in runs),
            **summary(values), "build_seconds_median": summary(inner)["median"]}


def rebuild_benchmark(source: Path, task_ref: str, edits: int, cli_edits: int, budget: Budget,
                      stop_at: float) -> dict[str, Any]:
    """Part 1. ``stop_at`` is the budget.left() below which no new build starts."""
    out: dict[str, Any] = {"workspace": str(source), "task": task_ref, "series": [],
                           "notes": []}
    work = temp_dir("foundation-ws-")
    ws = work / source.name
    shutil.copytree(source, ws, ignore=shutil.ignore_patterns("build", "__pycache__"))
    out["copy"] = str(ws)
    kernels = ws / "kernels"
    cu_files = sorted(kernels.rglob("*.cu"))
    bindings = sorted(kernels.rglob("*_binding.cpp"))
    out["cu_file"] = str(cu_files[0].relative_to(ws)) if cu_files else None
    out["binding_file"] = str(bindings[0].relative_to(ws)) if bindings else None

    from cuda_agent.build import BuildConfig, Builder

    builder = Builder(BuildConfig(device="cuda"))

    def time_left() -> bool:
        if budget.left() < stop_at:
            out["notes"].append("stopped early: time budget")
            return False
        return True

    cold = build_once(builder, ws)
    out["series"].append(series("cold build (in-process)", [cold], "seconds"))
    log(f"  cold build: ok={cold['ok']} {cold['seconds']:.2f} s compiled={cold['compiled']}")
    if not cold["ok"]:
        log("  cold build failed:\n" + "\n".join(cold.get("errors", [])) + "\n" +
            cold.get("log", ""))
        return out

    runs = [build_once(builder, ws) for _ in range(3)]
    out["series"].append(series("no-change rebuild (in-process)", runs, "seconds"))
    log("  no-change: " + ", ".join(f"{r['seconds']:.3f}" for r in runs) + " s")

    def edit_series(label: str, path: Path | None, count: int, runner, key: str) -> None:
        # `path` is edited `count` times, one build after each; then restored.
        if path is None:
            out["notes"].append(f"{label}: no such file in the workspace")
            return
        original = path.read_text()
        runs = []
        try:
            for i in range(count):
                if not time_left():
                    break
                path.write_text(edited(original, i, label))
                rec = runner()
                rec["edit"] = i
                runs.append(rec)
                if not rec.get("ok"):
                    log(f"  {label} edit {i} failed: {rec.get('errors') or rec.get('stderr')}")
                    break
        finally:
            path.write_text(original)
        out["series"].append(series(label, runs, key))
        values = [r[key] for r in runs if r.get("ok")]
        log(f"  {label}: " + ", ".join(f"{v:.2f}" for v in values) + " s")
        wrong = [r["compiled"] for r in runs if r.get("ok") and "compiled" in r
                 and len(r["compiled"]) != 1]
        if wrong:
            out["notes"].append(f"{label}: builds that recompiled other than one file: {wrong}")

    cu = cu_files[0] if cu_files else None
    binding = bindings[0] if bindings else None
    edit_series("edit .cu (in-process)", cu, edits, lambda: build_once(builder, ws), "seconds")
    edit_series("edit binding .cpp (in-process)", binding, edits,
                lambda: build_once(builder, ws), "seconds")

    # The same through the command line, timed as wall clock.
    if importlib.util.find_spec(CLI_MODULE) is None:
        out["cli"] = f"missing: module {CLI_MODULE} not found"
        log(f"  CLI: {out['cli']}")
        return out
    # `workspace build` wants a workspace made by `workspace init`: make one for the same
    # task and put the candidate's kernels/ and model_new.py into it.
    cli_ws = work / "cli_workspace"
    cmd = [sys.executable, "-m", CLI_MODULE, "workspace", "init", task_ref, str(cli_ws),
           "--device", "cuda"]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=180,
                              env=child_env())
    except subprocess.TimeoutExpired:
        out["cli"] = "workspace init timed out"
        return out
    out["cli_init_s"] = time.perf_counter() - start
    if proc.returncode != 0:
        out["cli"] = f"workspace init failed (rc={proc.returncode}): {tail(proc.stderr, 600)}"
        log(f"  CLI: {out['cli']}")
        return out
    shutil.rmtree(cli_ws / "kernels")
    shutil.copytree(ws / "kernels", cli_ws / "kernels")
    shutil.copy2(ws / "model_new.py", cli_ws / "model_new.py")
    # Same sources as the in-process builds, so the first CLI build finds them cached.
    first = cli_build_once(cli_ws, min(120.0, max(budget.left() - stop_at, 1)))
    if not first["ok"]:
        out["cli"] = "workspace build failed"
        out["series"].append(series("no-change rebuild (CLI wall)", [first], "wall_s"))
        log(f"  CLI build failed (rc={first.get('rc')}): "
            f"{(first.get('stdout', '') + first.get('stderr', ''))[-800:]}")
        return out
    out["cli"] = "ok"
    runs = [first] + [cli_build_once(cli_ws, 120.0) for _ in range(2) if time_left()]
    out["series"].append(series("no-change rebuild (CLI wall)", runs, "wall_s"))
    log("  CLI no-change: " + ", ".join(f"{r['wall_s']:.2f}" for r in runs) + " s")
    cli_cu = cli_ws / cu.relative_to(ws) if cu else None
    cli_binding = cli_ws / binding.relative_to(ws) if binding else None
    edit_series("edit .cu (CLI wall)", cli_cu, cli_edits,
                lambda: cli_build_once(cli_ws, 120.0), "wall_s")
    edit_series("edit binding .cpp (CLI wall)", cli_binding, cli_edits,
                lambda: cli_build_once(cli_ws, 120.0), "wall_s")
    return out


# ---------------------------------------------------------------------------------------------
# Part 2: judge


def parse_json_output(text: str) -> dict[str, Any] | None:
    text = text.strip()
    if not text:
        return None
    try:
        value = json.loads(text)
        return value if isinstance(value, dict) else {"value": value}
    except json.JSONDecodeError:
        pass
    # Log lines before or after the JSON object: take the outermost {...}.
    start, end = text.find("{"), text.rfind("}")
    if 0 <= start < end:
        try:
            value = json.loads(text[start:end + 1])
            return value if isinstance(value, dict) else {"value": value}
        except json.JSONDecodeError:
            pass
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    return None


def task_ref(kernelbench: Path, tasks: Path | None, problem_id: int, folder: str) -> str:
    if tasks is not None:
        return str((tasks / f"{folder}.py").resolve())
    return f"{kernelbench}::1/{problem_id}"


def judge_one(ref: str, problem_id: int, folder: str, timeout: float) -> dict[str, Any]:
    rec: dict[str, Any] = {"problem_id": problem_id, "candidate": folder, "task_ref": ref}
    source = CANDIDATES_DIR / folder
    if not source.is_dir():
        rec["error"] = f"candidate folder {source} not found"
        return rec
    work = temp_dir("foundation-judge-")
    candidate = work / folder
    shutil.copytree(source, candidate, ignore=shutil.ignore_patterns("build", "__pycache__"))
    cmd = [sys.executable, "-m", CLI_MODULE, "judge", ref, str(candidate), "--device", "cuda",
           "--json"]
    rec["command"] = " ".join(cmd)
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=max(timeout, 1),
                              check=False, env=child_env(), cwd=str(REPO))
    except subprocess.TimeoutExpired as exc:
        rec["wall_s"] = time.perf_counter() - start
        rec["error"] = f"timed out after {timeout:.0f} s"
        rec["stderr"] = tail(exc.stderr)
        return rec
    rec["wall_s"] = time.perf_counter() - start
    rec["rc"] = proc.returncode
    verdict = parse_json_output(proc.stdout)
    if verdict is None:
        rec["error"] = f"no JSON verdict (rc={proc.returncode})"
        rec["stdout"] = tail(proc.stdout)
        rec["stderr"] = tail(proc.stderr)
        return rec
    rec["verdict"] = verdict
    rec.update({k: verdict.get(k) for k in JUDGE_KEYS})
    if proc.returncode != 0:
        rec["stderr"] = tail(proc.stderr, 1000)
    return rec


# ---------------------------------------------------------------------------------------------
# Part 3: report


def markdown(report: dict[str, Any]) -> str:
    env = report.get("environment", {})
    lines = [
        f"## Foundation GPU benchmark ({env.get('date', '?')})",
        "",
        f"{env.get('device', 'no GPU')} | torch {env.get('torch', '?')} "
        f"(CUDA {env.get('torch_cuda', '?')}) | nvcc {env.get('nvcc', '?')} | "
        f"python {env.get('python', '?')} | total {fmt(report.get('total_s'), 1)} s",
        "",
    ]
    rebuild = report.get("rebuild") or {}
    lines += [f"### Rebuilds of {Path(rebuild.get('workspace', '?')).name} "
              f"(.cu: {rebuild.get('cu_file')}, binding: {rebuild.get('binding_file')})", "",
              "| series | builds ok | median s | min s | max s | median BuildResult.seconds |",
              "| --- | --- | --- | --- | --- | --- |"]
    for s in rebuild.get("series", []):
        lines.append(f"| {s['series']} | {s['ok']}/{len(s['runs'])} | {fmt(s['median'])} | "
                     f"{fmt(s['min'])} | {fmt(s['max'])} | {fmt(s.get('build_seconds_median'))} |")
    if "cli" in rebuild:
        lines.append(f"\nCLI: {rebuild['cli']}")
    for note in rebuild.get("notes", []):
        lines.append(f"\nNote: {note}")
    if rebuild.get("error"):
        lines.append(f"\nRebuild benchmark error: {rebuild['error'].splitlines()[-1]}")
    lines += ["", "### Judge", "",
              "| task | compiled | correct | reward | runtime ms | eager ms | compile ms "
              "| vs eager | vs compile | wall s | reasons / error |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for j in report.get("judge", []):
        reasons = j.get("error") or "; ".join(map(str, j.get("reasons") or []))
        reasons = reasons.replace("|", "/").replace("\n", " ")[:160]
        lines.append(
            f"| {j.get('task') or j.get('candidate')} | {fmt(j.get('compiled'))} | "
            f"{fmt(j.get('correct'))} | {fmt(j.get('reward'))} | {fmt(j.get('runtime_ms'))} | "
            f"{fmt(j.get('eager_ms'))} | {fmt(j.get('compile_ms'))} | "
            f"{fmt(j.get('speedup_vs_eager'), 2)} | {fmt(j.get('speedup_vs_compile'), 2)} | "
            f"{fmt(j.get('wall_s'), 1)} | {reasons} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Foundation GPU benchmark: rebuild times and judge verdicts.",
        epilog="Run as: PYTHONPATH=src python3 benchmarks/foundation_gpu.py --out $OUT")
    parser.add_argument("--out", type=Path, default=None,
                        help="folder for foundation_gpu.json and foundation_gpu.md")
    parser.add_argument("--kernelbench", type=Path,
                        default=Path("shared/kernelbench/kernelbench.jsonl"),
                        help="KernelBench problems (jsonl); default %(default)s")
    parser.add_argument("--tasks", type=Path, default=None,
                        help="folder of task files <candidate folder>.py to use instead of "
                             "--kernelbench")
    parser.add_argument("--workspace", type=Path, default=CANDIDATES_DIR / "40_LayerNorm",
                        help="candidate workspace to time rebuilds on; default %(default)s")
    parser.add_argument("--edits", type=int, default=10,
                        help="in-process rebuilds per edited file (default %(default)s)")
    parser.add_argument("--cli-edits", type=int, default=5,
                        help="command-line rebuilds per edited file (default %(default)s)")
    parser.add_argument("--budget-s", type=float, default=470.0,
                        help="wall-clock budget for the whole run (default %(default)s)")
    parser.add_argument("--judge-timeout-s", type=float, default=200.0,
                        help="limit for one judge command (default %(default)s)")
    parser.add_argument("--skip-rebuild", action="store_true", help="skip part 1")
    parser.add_argument("--skip-judge", action="store_true", help="skip part 2")
    args = parser.parse_args(argv)

    start = time.perf_counter()
    budget = Budget(args.budget_s)
    home = temp_dir("foundation-home-")
    os.environ["CUDA_AGENT_HOME"] = str(home)
    report: dict[str, Any] = {"argv": sys.argv, "judge": []}

    try:
        report["environment"] = environment()
    except Exception:  # noqa: BLE001
        report["environment"] = {"error": traceback.format_exc()}
    log("# Environment")
    for key, value in report["environment"].items():
        log(f"  {key}: {value}")

    # Leave about 3 minutes of the budget to the judge, unless it is skipped.
    judge_reserve = 0.0 if args.skip_judge else min(180.0, args.budget_s * 0.4)
    if not args.skip_rebuild:
        log(f"\n# Rebuilds ({args.workspace})")
        try:
            source = args.workspace.resolve()
            pid = int(source.name.split("_", 1)[0]) if source.name[:1].isdigit() else 0
            ref = task_ref(args.kernelbench.resolve(), args.tasks, pid, source.name)
            report["rebuild"] = rebuild_benchmark(source, ref, args.edits, args.cli_edits,
                                                  budget, judge_reserve)
        except Exception:  # noqa: BLE001
            report["rebuild"] = {"workspace": str(args.workspace), "series": [],
                                 "error": traceback.format_exc()}
            log(report["rebuild"]["error"])

    if not args.skip_judge:
        log("\n# Judge")
        kernelbench = args.kernelbench.resolve()
        if args.tasks is None and not kernelbench.exists():
            log(f"  warning: {kernelbench} not found; the judge will report it")
        for index, (problem_id, folder) in enumerate(PROBLEMS):
            remaining = budget.left()
            # Share what is left between the judges still to run.
            share = remaining / (len(PROBLEMS) - index)
            timeout = min(args.judge_timeout_s, max(share, 30.0), remaining - 5)
            if timeout < 20:
                report["judge"].append({"problem_id": problem_id, "candidate": folder,
                                        "error": "skipped: time budget"})
                log(f"  1/{problem_id}: skipped (time budget)")
                continue
            try:
                ref = task_ref(kernelbench, args.tasks, problem_id, folder)
                rec = judge_one(ref, problem_id, folder, timeout)
            except Exception:  # noqa: BLE001
                rec = {"problem_id": problem_id, "candidate": folder,
                       "error": traceback.format_exc().splitlines()[-1],
                       "traceback": traceback.format_exc()}
            report["judge"].append(rec)
            brief = {k: rec.get(k) for k in ("correct", "reward", "runtime_ms", "eager_ms",
                                             "compile_ms", "wall_s", "error")}
            log(f"  1/{problem_id} {folder}: {brief}")
            if rec.get("stderr") and rec.get("error"):
                log("    stderr: " + rec["stderr"][-600:])

    report["total_s"] = time.perf_counter() - start
    table = markdown(report)
    if args.out:
        try:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "foundation_gpu.json").write_text(json.dumps(report, indent=1,
                                                                     default=str))
            (args.out / "foundation_gpu.md").write_text(table)
        except OSError as exc:
            log(f"could not write to {args.out}: {exc}")
    for path in TEMP_DIRS:
        shutil.rmtree(path, ignore_errors=True)
    log("\n" + table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
