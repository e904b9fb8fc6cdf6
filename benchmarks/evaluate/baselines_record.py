"""Merge the shards of a baseline measurement and write its versioned record
(``device_baselines.sh``; docs/evaluation.md, "Baselines").

    python3 benchmarks/evaluate/baselines_record.py merge OUT
    python3 benchmarks/evaluate/baselines_record.py record OUT --wall-s 512 --gpus 4 \
        --per-gpu 3 [--previous PREV] [--scaling OUT/scaling.json]

``merge``: the rows of ``OUT/all/previous.jsonl`` and every ``OUT/gpu*/baselines.jsonl``
into ``OUT/all/baselines.jsonl``, one row per task key (a later shard's row wins, an error
row never over a measured one), and says how many rows each shard brought and whether a
task was measured by two shards (the shard logic must give each task to one).
``record``: ``OUT/all/baselines-JUDGE_VERSION.json``: the device, commit, judge and torch
versions, the tasks done, cached, failed and pending, this call's wall time and the total
over the calls that resumed each other (``--previous``), the tasks' own seconds, and the
scaling against one GPU where ``--scaling`` holds one measured.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def merge(out: Path) -> dict[str, Any]:
    """One row per task in ``out/all/baselines.jsonl``; what each shard brought."""
    rows: dict[str, dict[str, Any]] = {}
    previous = out / "all" / "previous.jsonl"
    sources = ([previous] if previous.is_file() else []) + sorted(
        out.glob("gpu*/baselines.jsonl"), key=lambda p: int(p.parent.name[3:] or 0))
    brought: dict[str, int] = {}
    measured_by: dict[str, list[str]] = {}
    earlier = set(previous.read_text().splitlines()) if previous.is_file() else set()
    for path in sources:
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            row = json.loads(line)
            # each shard's file starts with a copy of the earlier rows: those are not its own
            if path != previous and line not in earlier and row.get("source") == "measured":
                measured_by.setdefault(row["key"], []).append(path.parent.name)
            if row.get("source") == "error" and rows.get(row["key"], {}).get("source") in (
                    "measured", "cached"):
                continue
            rows[row["key"]] = row
            brought[path.parent.name] = brought.get(path.parent.name, 0) + 1
    (out / "all").mkdir(parents=True, exist_ok=True)
    (out / "all" / "baselines.jsonl").write_text(
        "".join(json.dumps(row) + "\n" for row in rows.values()))
    twice = {k: v for k, v in measured_by.items() if len(set(v)) > 1}
    return {"rows": len(rows), "brought": brought, "measured_twice": twice}


def record(out: Path, wall_s: float, gpus: int, per_gpu: int, previous: Path | None,
           scaling: Path | None) -> Path:
    """Write the versioned record of the measurement in ``out``; returns its path."""
    from cuda_agent.evaluate.record import commit, machine
    from cuda_agent.judge.config import JUDGE_VERSION

    summary = json.loads((out / "all" / "summary.json").read_text())
    rows = [json.loads(line) for line in
            (out / "all" / "baselines.jsonl").read_text().splitlines() if line.strip()]
    earlier = _earlier(previous)
    data = {
        "judge_version": JUDGE_VERSION, "commit": commit(), "machine": machine(),
        "device": summary.get("device"), "gpus": gpus, "shards_per_gpu": per_gpu,
        "tasks": summary["overall"]["tasks"] + summary.get("pending", 0),
        "done": summary["overall"]["tasks"], "measured": summary["overall"]["measured"],
        "cached": summary["overall"]["cached"], "errors": summary["overall"]["errors"],
        "pending": summary.get("pending", 0),
        "wall_s": round(wall_s, 1), "wall_s_total": round(wall_s + earlier, 1),
        "task_s": round(sum(float(r.get("seconds") or 0.0) for r in rows), 1),
        "scaling": json.loads(scaling.read_text()) if scaling and scaling.is_file() else None,
        "rows": "baselines.jsonl",
    }
    path = out / "all" / f"baselines-{JUDGE_VERSION}.json"
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def _earlier(previous: Path | None) -> float:
    """The wall time of the calls ``previous`` continued (its own record's total)."""
    if previous is None:
        return 0.0
    for found in sorted((previous / "all").glob("baselines-*.json")):
        return float(json.loads(found.read_text()).get("wall_s_total") or 0.0)
    return 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=("merge", "record"))
    parser.add_argument("out", type=Path)
    parser.add_argument("--wall-s", type=float, default=0.0)
    parser.add_argument("--gpus", type=int, default=1)
    parser.add_argument("--per-gpu", type=int, default=1)
    parser.add_argument("--previous", type=Path, default=None)
    parser.add_argument("--scaling", type=Path, default=None)
    args = parser.parse_args()
    if args.what == "merge":
        found = merge(args.out)
        print(json.dumps(found))
        return 1 if found["measured_twice"] else 0
    print(record(args.out, args.wall_s, args.gpus, args.per_gpu, args.previous, args.scaling))
    return 0


if __name__ == "__main__":
    sys.exit(main())
