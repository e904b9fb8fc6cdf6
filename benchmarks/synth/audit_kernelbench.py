"""Audit the task filters on KernelBench levels 1-3 (CPU, sizes shrunk).

    .venv/bin/python benchmarks/synth/audit_kernelbench.py \\
        --kernelbench ../shared/kernelbench/kernelbench.jsonl --out runs/synth-audit

Runs ``cuda-agent synth audit`` (every filter except KernelBench similarity; runtime window
open, since shrunk CPU times say nothing about GPU times; torch.compile off unless
``--compile``), then compares the rejections with the defects publicly reported for
KernelBench problems. The report list is used here, to score the filters, and nowhere in
the filters themselves.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from cuda_agent.synth.audit import audit
from cuda_agent.synth.config import FilterConfig

# public reports (see the KernelBench copy's README): level -> problem ids
REPORTED = {1: (19, 20, 23, 31, 32, 37, 94, 96, 100),
            2: (7, 23, 44, 66, 80, 81, 83, 95), 3: (36, 37, 49)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernelbench", type=Path,
                        default=Path("../shared/kernelbench/kernelbench.jsonl"))
    parser.add_argument("--out", type=Path, default=Path("runs/synth-audit"))
    parser.add_argument("--max-numel", type=int, default=1 << 18)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--compile", action="store_true")
    args = parser.parse_args()
    filters = FilterConfig(compile_check=args.compile, max_numel=args.max_numel,
                           min_ms_cpu=0.0, max_ms_cpu=1e9, task_timeout_s=300)
    start = time.time()
    rows = audit(args.kernelbench, args.out, filters, "cpu", args.workers,
                 progress=lambda d, n: print(f"{d}/{n} {time.time() - start:.0f}s", flush=True))
    by_id = {(r["level"], r["problem_id"]): r for r in rows}
    lines = ["| reported problem | rejected | reasons |", "|---|---|---|"]
    found = 0
    for level, ids in REPORTED.items():
        for pid in ids:
            row = by_id.get((level, pid))
            if row is None:
                continue
            found += not row["accepted"]
            why = "; ".join(r[:120].replace("|", "/") for r in row["reasons"]) or "-"
            lines.append(f"| L{level}/{pid} {row['name']} | {not row['accepted']} | {why} |")
    total = sum(len(v) for v in REPORTED.values())
    lines.append(f"\n{found} of {total} reported problems rejected; "
                 f"{sum(not r['accepted'] for r in rows)} of {len(rows)} problems rejected in "
                 f"all; {time.time() - start:.0f} s.")
    (args.out / "reported.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(json.dumps({"rejected": sum(not r["accepted"] for r in rows), "problems": len(rows)}))


if __name__ == "__main__":
    main()
