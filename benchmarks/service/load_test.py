"""Load test of the environment service: N concurrent episodes against `cuda-agent serve` on
loopback (CPU). Each episode opens, writes the shipped CPU solution (every fourth a wrong
one) with its own marker, builds, judges (timing off; `--verify` adds a verify call), reads
its reward and judgements, diffs and closes. Prints p50/p99 per tool and totals, and fails
if any job is lost or duplicated, or any episode got an answer that is not its own.

    .venv/bin/python benchmarks/service/load_test.py --episodes 64 --workers 2
"""

from __future__ import annotations

import argparse
import math
import os
import secrets
import socket
import subprocess
import sys
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TASK = "builtin:gelu_bias_scale"
SOLUTION = ROOT / "src" / "cuda_agent" / "examples" / "gelu_bias_scale" / "solution" / "cpu"
FAST = ["trials=2", "scales=[]", "time=false"]


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(p / 100 * len(ordered))) - 1] if ordered else 0.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_service(port: int, key: str, episodes: int, workers: int, root: Path
                  ) -> subprocess.Popen:
    sets = [f"--set=pool.judge.{s}" for s in FAST] + [f"--set=judge.{s}" for s in FAST]
    argv = [sys.executable, "-m", "cuda_agent", "serve", "--port", str(port), "--device", "cpu",
            "--workers", str(workers), "--max-episodes", str(episodes), "--root", str(root),
            "--set=tool_timeout_s=1800", "--set=busy_timeout_s=1800", *sets]
    env = {**os.environ, "CUDA_AGENT_API_KEYS": key}
    return subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)


def wait_healthy(client, proc: subprocess.Popen, timeout_s: float = 120.0) -> None:
    from cuda_agent.service import ServiceError

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"service exited: {proc.stderr.read()[-2000:]}")
        try:
            client.health()
            return
        except ServiceError:
            time.sleep(0.2)
    raise SystemExit("service did not come up")


def solution(index: int, wrong: bool) -> dict[str, str]:
    files = {p.relative_to(SOLUTION).as_posix(): p.read_text()
             for p in SOLUTION.rglob("*") if p.is_file()}
    model = files["model_new.py"]
    if wrong:
        model = model.replace("self.bias, self.scale)", "self.bias, 2 * self.scale)")
    files["model_new.py"] = f"# load-test episode {index}\n{model}"
    return files


def episode_run(client, index: int, verify: bool, times: dict[str, list[float]]) -> dict:
    """One episode; returns what it saw, for the cross-checks."""
    def timed(tool: str, fn, *args):
        start = time.perf_counter()
        out = fn(*args)
        times[tool].append(time.perf_counter() - start)
        return out

    wrong = index % 4 == 3
    episode = timed("open", client.open_episode, TASK, "cpu")
    for path, text in solution(index, wrong).items():
        timed("write_file", episode.write_file, path, text)
    built = timed("build", episode.build)
    verified = timed("verify", episode.verify) if verify else None
    judged = timed("judge", episode.judge)
    reward = timed("reward", episode.reward)
    history = timed("judgements", episode.judgements)
    diff = timed("diff", episode.diff)
    timed("close", episode.close)
    return {"index": index, "wrong": wrong, "built": built["ok"], "judged": judged,
            "reward": reward, "history": history, "diff": diff["diff"],
            "verified": verified["correct"] if verified else None}


def check(records: list[dict], episodes: int) -> list[str]:
    """Every episode exactly one judgement, its own, with the reward its code deserves."""
    problems = []
    ids = [r["judged"]["judgement_id"] for r in records]
    if len(records) != episodes:
        problems.append(f"{episodes - len(records)} episodes missing")
    if len(set(ids)) != len(ids):
        problems.append("duplicated judgement ids")
    for r in records:
        want_ok = not r["wrong"]
        got = r["judged"]["reward"]
        if r["judged"]["failure"] or got is None or (got >= 1) != want_ok or got == 0:
            problems.append(f"episode {r['index']}: reward {got} ({r['judged']['failure']})")
        if [h["judgement_id"] for h in r["history"]] != [r["judged"]["judgement_id"]]:
            problems.append(f"episode {r['index']}: judgements {r['history']}")
        if r["reward"]["last"]["judgement_id"] != r["judged"]["judgement_id"]:
            problems.append(f"episode {r['index']}: /reward is another judgement")
        if f"+# load-test episode {r['index']}\n" not in r["diff"] or r["diff"].count(
                "# load-test episode") != 1:
            problems.append(f"episode {r['index']}: diff is not its own")
        if not r["built"] or r["verified"] not in (None, want_ok):
            problems.append(f"episode {r['index']}: build/verify {r['built']}/{r['verified']}")
    return problems


def table(times: dict[str, list[float]], wall: float, episodes: int) -> str:
    order = ["open", "write_file", "build", "verify", "judge", "reward", "judgements", "diff",
             "close"]
    lines = ["| tool | calls | p50 s | p99 s | max s |", "|---|---|---|---|---|"]
    for tool in [t for t in order if times.get(t)]:
        v = times[tool]
        lines.append(f"| {tool} | {len(v)} | {percentile(v, 50):.3f} | {percentile(v, 99):.3f}"
                     f" | {max(v):.3f} |")
    calls = sum(len(v) for v in times.values())
    lines.append(f"| **total** | {calls} | | | wall {wall:.1f} s, "
                 f"{episodes / wall * 60:.1f} episodes/min |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2, help="judge workers of the service")
    parser.add_argument("--verify", action="store_true", help="also call verify per episode")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    from cuda_agent.service import ServiceClient

    key = secrets.token_urlsafe(24)
    port = free_port()
    import tempfile

    with tempfile.TemporaryDirectory(prefix="cuda-agent-load-") as tmp:
        proc = start_service(port, key, args.episodes, args.workers, Path(tmp))
        try:
            with ServiceClient(f"http://127.0.0.1:{port}", key, timeout_s=3600) as client:
                wait_healthy(client, proc)
                times: dict[str, list[float]] = defaultdict(list)
                start = time.perf_counter()
                with ThreadPoolExecutor(args.episodes) as pool:
                    records = list(pool.map(
                        lambda i: episode_run(client, i, args.verify, times),
                        range(args.episodes)))
                wall = time.perf_counter() - start
                jobs = client.metrics()["judge_jobs"]
        finally:
            proc.terminate()
            proc.wait(60)
    problems = check(records, args.episodes)
    print(f"{args.episodes} concurrent episodes, {args.workers} judge workers, CPU, loopback; "
          f"judge {' '.join(FAST)}{'; with verify' if args.verify else ''}")
    print(table(times, wall, args.episodes))
    print(f"judge jobs: done {jobs['done']}, failed {jobs['failed']}, queued {jobs['queued']}, "
          f"replaced workers {jobs['replaced']}; rewards: "
          f"{sum(r['judged']['reward'] >= 1 for r in records)} >= 1, "
          f"{sum(r['judged']['reward'] == -1 for r in records)} = -1 (expected "
          f"{sum(not r['wrong'] for r in records)} / {sum(r['wrong'] for r in records)})")
    print("lost or duplicated jobs, or answers not their own: "
          + ("none" if not problems else "; ".join(problems[:10])))
    return 1 if problems or jobs["done"] != args.episodes else 0


if __name__ == "__main__":
    raise SystemExit(main())
