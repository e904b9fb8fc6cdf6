"""Do eager and candidate device times drift together? (GPU probe.)

Judgements agree worse than the processes inside one judgement do (docs/benchmarks.md,
judge-v9): the time wanders on scales of seconds, shared by processes that run close
together. If the wander is shared by the eager model and the candidate, a speed-up taken
from blocks timed in turn, eager and candidate alternating, would cancel it.

For each task (``1/12``, ``calibrated``) and each of ``--judgements`` rounds, two ways:

- ``apart``: one fresh process times the eager model for ``--blocks`` blocks of
  ``--calls`` calls and ends; then one fresh process does the same for the candidate (the
  judge's way, baselines measured at another moment);
- ``paired``: both processes start and warm up, then time their blocks in turn
  (eager, candidate, eager, ...), the other one waiting on its pipe meanwhile.

Each block uses the judge's device timing (gate, L2 flush, rotated inputs; the time is
elapsed(ev0, ev1)), after 3 untimed calls. Printed per task and way: the eager and candidate
medians and the speed-up of every round, and the spread ((max - min) / median) of each over
the rounds. Run on the GPU machine from the repository root:

    PYTHONPATH=src python3 benchmarks/judge_v2/paired_probe.py --kernelbench KB.jsonl
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def serve(spec: dict[str, Any]) -> None:
    """Child: load the target, warm up like the judge, then time one block per ``block``
    line read from stdin, printing its median (ms) as JSON."""
    import torch
    from blocker_probe import loaded
    from clock_probe import _prepare

    from cuda_agent.judge import timing
    from cuda_agent.judge.worker import make_inputs

    ns, model, ext = loaded(spec)
    timer = timing.DeviceTimer(timing.load_blocker(ext))
    rotation = timing.Rotation(lambda k: make_inputs(ns, 1000 + k, "cuda"), 2)
    flush = torch.zeros(timing.L2_FLUSH_BYTES // 4, device="cuda")
    with torch.no_grad():
        host = timing._warm_up(model, rotation, True, 3, spec["warmup_s"])
        timer.calibrate(statistics.median(host))
        print("ready", flush=True)
        for line in sys.stdin:
            if line.strip() != "block":
                break
            for _ in range(3):
                model(*rotation.prepare(None)[0])
            main, flushes = [], []
            for _ in range(spec["calls"]):
                inputs, flush_ms = _prepare(torch, timer, rotation, flush, "base")
                main.append(timer.call(model, inputs)[1])
                flushes.append(flush_ms)
            print(json.dumps({"main": statistics.median(main),
                              "flush": statistics.median(flushes)}), flush=True)


class Child:
    """A serving child process, started and warmed up."""

    def __init__(self, spec: dict[str, Any], path: Path):
        path.write_text(json.dumps(spec))
        self.proc = subprocess.Popen([sys.executable, __file__, "--child", str(path)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline().strip()
        if line != "ready":
            raise RuntimeError(f"child failed: {line} {self.proc.stderr.read()[-800:]}")

    def block(self) -> float:
        self.proc.stdin.write("block\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())["main"]

    def close(self) -> None:
        self.proc.stdin.write("quit\n")
        self.proc.stdin.flush()
        self.proc.wait(timeout=60)


def one_round(eager: dict[str, Any], cand: dict[str, Any], way: str, blocks: int
              ) -> dict[str, Any]:
    """One judgement's eager and candidate block medians, timed ``apart`` or ``paired``."""
    tmp = Path("/tmp")
    if way == "apart":
        found = []
        for i, spec in enumerate((eager, cand)):
            child = Child(spec, tmp / f"paired_{i}.json")
            found.append([child.block() for _ in range(blocks)])
            child.close()
        e, c = found
    else:
        children = [Child(eager, tmp / "paired_0.json"), Child(cand, tmp / "paired_1.json")]
        e, c = [], []
        for _ in range(blocks):
            e.append(children[0].block())
            c.append(children[1].block())
        for child in children:
            child.close()
    em, cm = statistics.median(e), statistics.median(c)
    by_pair = statistics.median(a / b for a, b in zip(e, c, strict=True))
    return {"eager": em, "cand": cm, "speedup": em / cm, "speedup_by_pair": by_pair,
            "eager_blocks": e, "cand_blocks": c}


def _spread(values: list[float]) -> float:
    return (max(values) - min(values)) / statistics.median(values) * 100


def _sd(values: list[float]) -> float:
    return statistics.stdev(values) / statistics.mean(values) * 100 if len(values) > 1 else 0.0


def main() -> int:
    from blocker_probe import probe_args, selected

    parser = argparse.ArgumentParser()
    probe_args(parser)
    parser.add_argument("--judgements", type=int, default=5)
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--warmup-s", type=float, default=0.2)
    parser.add_argument("--ways", default="apart,paired")
    args = parser.parse_args()
    if args.child:
        serve(json.loads(Path(args.child).read_text()))
        return 0
    found, blocker_ext = selected(args)
    named = dict(found)
    tasks = [t for t in ("1/12", "calibrated")
             if f"eager {t}" in named and f"cand {t}" in named
             and (not args.only or any(w in t for w in args.only.split(",")))]
    ways = args.ways.split(",")
    report: dict[str, Any] = {}
    for task in tasks:
        specs = [dict(named[f"{who} {task}"], calls=args.calls, warmup_s=args.warmup_s,
                      blocker_ext=blocker_ext) for who in ("eager", "cand")]
        runs: dict[str, list[dict[str, Any]]] = {w: [] for w in ways}
        for j in range(args.judgements):  # the ways alternate, so drift hits both alike
            for way in ways if j % 2 == 0 else ways[::-1]:
                runs[way].append(one_round(*specs, way, args.blocks))
        report[task] = runs
        for way, rounds in runs.items():
            print(f"== {task}, {way}", flush=True)
            for key in ("eager", "cand", "speedup", "speedup_by_pair"):
                values = [r[key] for r in rounds]
                print(f"  {key:<16} {' '.join(f'{v:.5f}' for v in values)}  spread "
                      f"{_spread(values):.2f}%  SD {_sd(values):.2f}%")
            inside = [_sd([a / b for a, b in zip(r["eager_blocks"], r["cand_blocks"],
                                                 strict=True)]) for r in rounds]
            print("  SD of block ratios inside rounds: "
                  + " ".join(f"{s:.2f}%" for s in inside), flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
