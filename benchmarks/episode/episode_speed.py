"""Every call an episode makes, timed where the agent and the user meet it: the `optimize`
replay episode's own tool calls (from its trajectory), then the workspace's commands and
`cuda-agent judge` from a shell. GPU machine, repository root (device_episode.sh):

    python3 benchmarks/episode/episode_speed.py --kernelbench .bench/kernelbench.jsonl --out OUT

Each step runs as a user would run it: a new process from a shell, timed from outside. The
results go to OUT/episode_speed.json and OUT/episode_speed.md, with device, date and commit.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "cuda_agent"]
DIAG = ROOT / "benchmarks/kernelbench_l1/12_Matmul_with_diagonal_matrices_"


def run(argv: list[str], cwd: Path | None = None, check: bool = True) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if check and done.returncode not in (0, 1):  # 1: judged, reward below 1
        raise SystemExit(f"{' '.join(map(str, argv))} failed ({done.returncode}):\n"
                         f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return seconds, done.stdout


def episode(device: str, out: Path) -> dict:
    """The optimize replay; each tool call's time from its own trajectory."""
    from cuda_agent.agent.optimize import tool_calls

    seconds, _ = run([*CLI, "optimize", "--device", device, "--out", str(out)])
    tools = tool_calls(out / "trajectory.jsonl")
    final = json.loads((out / "judge.json").read_text())
    print(f"optimize: {seconds:.1f} s, reward {final.get('reward')}")
    for t in tools:
        print(f"   turn {t['turn']:>2} {t['name']:<10} {t['seconds']:7.2f} s  ok={t['ok']}"
              + (f"  {t['phases']}" if t.get("phases") else ""))
    tools = [{**t, "seconds": round(t["seconds"], 3)} for t in tools]
    return {"wall_s": round(seconds, 2), "reward": final.get("reward"), "tools": tools,
            "final_s": round(final.get("seconds", 0.0), 2)}


def shell_steps(kb: Path, device: str, work: Path, repeats: int, think_s: float
                ) -> tuple[dict[str, list[float]], dict[str, float]]:
    """KernelBench 1/12 as a user meets it: a new task's first judgement, then utils/verify,
    utils/profile, then `cuda-agent judge` (measuring its baselines, then finding them
    cached); ``think_s`` between calls stands for the agent's thinking, while the warm judge
    starts its next workers."""
    from cuda_agent.paths import home_dir

    ws = work / "ws12"
    run([*CLI, "workspace", "init", f"{kb}::1/12", str(ws), "--device", device, "--force"])
    shutil.copytree(DIAG / "kernels", ws / "kernels", dirs_exist_ok=True)
    shutil.copy2(DIAG / "model_new.py", ws / "model_new.py")
    shutil.rmtree(home_dir() / "baselines", ignore_errors=True)  # a new task
    steps: dict[str, list[float]] = {}
    first, text = run([str(ws / "utils/profile"), "--json"])
    steps["first judgement of a new task (utils/profile)"] = [first]
    phases = {k: round(v, 2) for k, v in json.loads(text).get("phases", [])
              if "." not in k and v >= 0.05}
    print(f"first judgement {first:.1f} s; its phases: {phases}", flush=True)
    for name in ("verify", "profile"):
        steps[f"utils/{name} from a shell"] = [_think(think_s, run([str(ws / f"utils/{name}")]))
                                               for _ in range(repeats)]
        print(f"utils/{name}: {steps[f'utils/{name} from a shell']}", flush=True)
    edits = []
    for i in range(repeats):
        for cu in (ws / "kernels").glob("*.cu"):
            cu.write_text(cu.read_text() + f"\n// edit {i} {time.time()}\n")
        edits.append(_think(think_s, run([str(ws / "utils/profile")])))
    steps["utils/profile after an edit (nvcc)"] = edits
    print(f"utils/profile after an edit: {edits}", flush=True)
    # the episode's calls keep their baselines to themselves, so the first `cuda-agent judge`
    # measures and stores them; the next ones find them cached
    judge = [*CLI, "judge", f"{kb}::1/12", str(ws)]
    steps["cuda-agent judge (measures its baselines)"] = [run(judge)[0]]
    steps["cuda-agent judge (baselines cached)"] = [run(judge)[0] for _ in range(2)]
    print(f"cuda-agent judge: {steps['cuda-agent judge (measures its baselines)']} then "
          f"{steps['cuda-agent judge (baselines cached)']}", flush=True)
    _stop_server(ws)
    return steps, phases


def single_file(kb: Path, work: Path) -> dict:
    """A load_inline candidate: plain load_inline, then its first and an unchanged judgement."""
    source = ROOT / "benchmarks/episode/diag_inline.py"
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(work / "plain-ext")}
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", f"exec(open({str(source)!r}).read())"], env=env,
                   check=True, capture_output=True)
    plain = time.perf_counter() - start
    judge = [*CLI, "judge", f"{kb}::1/12", str(source), "--no-time", "--json"]
    first, text = run(judge)
    again, text2 = run(judge)
    rewards = [json.loads(t).get("reward") for t in (text, text2)]
    print(f"single file: plain {plain:.1f} s, judged {first:.1f} s then {again:.1f} s, "
          f"rewards {rewards}", flush=True)
    return {"plain load_inline": [round(plain, 2)], "first judgement": [round(first, 2)],
            "unchanged source judged again": [round(again, 2)], "rewards": rewards}


def _think(seconds: float, done: tuple[float, str]) -> float:
    time.sleep(seconds)
    return done[0]


def _stop_server(ws: Path) -> None:
    from cuda_agent.execution.warm_judge import WarmJudge

    found = WarmJudge(ws).ping()
    if found:
        os.kill(found["pid"], signal.SIGTERM)


def _device() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                              capture_output=True, text=True).stdout.strip() or "cpu"
    except OSError:
        return "cpu"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kernelbench", type=Path, default=ROOT / ".bench/kernelbench.jsonl")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--parts", default="episode,shell,single")
    parser.add_argument("--think-s", type=float, default=3.0,
                        help="pause after each shell call (the agent's thinking)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="episode-speed-"))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()
    record = {"device": _device(), "date": datetime.datetime.now(datetime.UTC).isoformat(
        timespec="seconds"), "commit": os.environ.get("COMMIT") or commit or "?"}
    parts = args.parts.split(",")
    if "episode" in parts:
        record["episode"] = episode(args.device, work / "opt")
    if "shell" in parts:
        steps, record["first_phases"] = shell_steps(args.kernelbench, args.device, work,
                                                    args.repeats, args.think_s)
        record["think_s"] = args.think_s
        record["shell"] = {k: [round(v, 2) for v in vs] for k, vs in steps.items()}
    if "single" in parts and args.device == "cuda":
        record["single_file"] = single_file(args.kernelbench, work)
    (args.out / "episode_speed.json").write_text(json.dumps(record, indent=1) + "\n")
    lines = [f"# Episode speed: {record['device']}, {record['date']}, commit {record['commit']}",
             "", "| step | seconds (each run) | median |", "|---|---|---|"]
    if "episode" in record:
        ep = record["episode"]
        for name in ("build", "verify", "profile"):
            times = [t["seconds"] for t in ep["tools"] if t["name"] == name]
            if times:
                lines.append(f"| optimize episode: {name} tool | {times} | "
                             f"{statistics.median(times):.2f} |")
        lines.append(f"| optimize episode: final judgement | [{ep['final_s']}] | |")
    for group in ("shell", "single_file"):
        for name, times in record.get(group, {}).items():
            if name != "rewards":
                lines.append(f"| {name} | {times} | {statistics.median(times):.2f} |")
    (args.out / "episode_speed.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
