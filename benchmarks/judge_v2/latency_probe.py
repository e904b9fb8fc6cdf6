"""Where a judgement's time goes: judge level-1 candidates with cached baselines and print
the phases (judge steps and worker stages). GPU machine, repository root:

    PYTHONPATH=src python3 benchmarks/judge_v2/latency_probe.py --kernelbench KB.jsonl

``--spares-between`` starts each judgement's workers before it (while the agent would think)
instead of while the previous one runs, to see what their start-up costs the judgement it
overlaps. ``--cuda-flag F`` (repeatable) adds F to every nvcc compile
(``BuildConfig.extra_cuda_cflags``); each judgement's line also gives the candidate's judged
runtime, to see a flag's effect on the kernel as well as on the build.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CANDIDATES = {12: "12_Matmul_with_diagonal_matrices_", 40: "40_LayerNorm",
              10: "10_3D_tensor_matrix_multiplication"}


def main() -> int:
    from cuda_agent.build.builder import BuildConfig
    from cuda_agent.judge.candidate import Candidate
    from cuda_agent.judge.config import JudgeConfig
    from cuda_agent.judge.judge import Judge
    from cuda_agent.tasks import load_task

    parser = argparse.ArgumentParser()
    parser.add_argument("--kernelbench", type=Path, default=ROOT / ".bench/kernelbench.jsonl")
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--ids", default="12,40,10")
    parser.add_argument("--cuda-flag", action="append", default=[],
                        help="added to every nvcc compile (repeatable)")
    parser.add_argument("--spares-between", action="store_true",
                        help="start the next judgement's workers between judgements, not "
                        "while one runs (keep_warm off, Judge.warm() before each)")
    parser.add_argument("--candidate-processes", type=int, default=1,
                        help="JudgeConfig.candidate_processes (1: as the agent's own verify "
                        "and profile calls; 0: the judge's default, candidate_processes_for)")
    parser.add_argument("--no-split-timing", action="store_true",
                        help="JudgeConfig.split_timing off: every candidate process times to "
                        "the full interval")
    args = parser.parse_args()
    build = BuildConfig(extra_cuda_cflags=tuple(args.cuda_flag))
    judge = Judge(JudgeConfig(device="cuda", keep_warm=not args.spares_between, build=build,
                              candidate_processes=args.candidate_processes or None,
                              split_timing=not args.no_split_timing))
    for pid in map(int, args.ids.split(",")):
        task = load_task(f"{args.kernelbench}::1/{pid}")
        work = Path(tempfile.mkdtemp()) / "ws"
        shutil.copytree(ROOT / "benchmarks/kernelbench_l1" / CANDIDATES[pid], work)
        walls, phases = [], []
        for i in range(args.iters + 1):
            for cu in (work / "kernels").glob("*.cu"):
                cu.write_text(cu.read_text() + f"\n// edit {time.time()} {i}\n")
            judge.warm()  # the agent's think time between edits: spare workers are ready
            start = time.perf_counter()
            result = judge.judge(task, Candidate.from_ref(work))
            wall = time.perf_counter() - start
            runtime = f"{result.runtime_ms:.4f} ms" if result.runtime_ms else "-"
            clock = result.timing.clock_ms if result.timing else None
            judged = f"{clock:.4f} ms" if clock else "-"
            print(f"1/{pid} iter {i}: {wall:.2f} s reward {result.reward} runtime {runtime} "
                  f"judge's clock {judged} {'; '.join([*result.reasons, *result.flags])[:300]}",
                  flush=True)
            if i:  # iteration 0 fills the baseline cache
                walls.append(wall)
                phases.append(dict(result.phases))
        rounded = [round(w, 2) for w in walls]
        print(f"1/{pid} median {statistics.median(walls):.2f} s  all {rounded}")
        for key in phases[-1]:
            print(f"   {key:28} {statistics.median(p.get(key, 0) for p in phases):7.3f}")
    judge.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
