"""Profile one candidate worker job in-process (cProfile), to see where its stages go.

    PYTHONPATH=src python3 benchmarks/judge_v2/profile_candidate.py --kernelbench KB.jsonl
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main() -> int:
    from cuda_agent.build.builder import BuildConfig, Builder
    from cuda_agent.judge.config import JudgeConfig
    from cuda_agent.judge.judge import _Plan
    from cuda_agent.judge.worker import Progress, run
    from cuda_agent.tasks import load_task

    parser = argparse.ArgumentParser()
    parser.add_argument("--kernelbench", type=Path, default=ROOT / ".bench/kernelbench.jsonl")
    parser.add_argument("--id", type=int, default=12)
    parser.add_argument("--folder", default="12_Matmul_with_diagonal_matrices_")
    args = parser.parse_args()
    task = load_task(f"{args.kernelbench}::1/{args.id}")
    tmp = Path(tempfile.mkdtemp())
    plan = _Plan(JudgeConfig(device="cuda"), task, "cuda", 123, tmp)
    builder = Builder(BuildConfig(device="cuda"))
    where = ROOT / "benchmarks/kernelbench_l1" / args.folder
    ext = builder.build(where).extension_path
    (tmp / "ref").mkdir()
    run(plan.job("reference", time=False), tmp / "ref", Progress(tmp / "ref"), lambda s: None)
    (tmp / "cand").mkdir()
    job = plan.job("candidate", candidate_dir=str(where), extension=ext, tracer=None)
    result = Progress(tmp / "cand")
    prof = cProfile.Profile()
    prof.enable()
    run(job, tmp / "cand", result, lambda s: None)
    prof.disable()
    stages = sorted(result["stage_at"].items(), key=lambda kv: kv[1])
    for (a, t0), (_, t1) in zip(stages, stages[1:], strict=False):
        print(f"stage {a:10} {t1 - t0:7.3f} s")
    pstats.Stats(prof).sort_stats("cumulative").print_stats(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
