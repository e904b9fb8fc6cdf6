"""Where an incremental build's time goes, and what the link costs with other linkers.

Copies a KernelBench level-1 candidate workspace, edits its ``.cu`` and rebuilds it
``--iters`` times, printing each compiler and linker run; then re-runs the last link
command as it is, without ``--no-undefined``, and with each other linker found
(``-fuse-ld=gold|lld|mold``), with the errors each printed (``--noinhibit-exec`` keeps the
exit status at 0: gold's errors on the H100 host were seen only in the judge). Needs the
CUDA toolchain (GPU machine, repository root):

    PYTHONPATH=src python3 benchmarks/build/build_steps_probe.py --ids 12,40
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from cuda_agent.build import BuildConfig, Builder, nvcc_split

ROOT = Path(__file__).resolve().parents[2]
CANDIDATES = {12: "12_Matmul_with_diagonal_matrices_", 40: "40_LayerNorm"}
LINKERS = ("gold", "lld", "mold")


def _timed(run, label: str, seen: list[list[str]]):
    def wrapper(cmd, cwd, timeout_s, *args, **kwargs):
        start = time.perf_counter()
        done = run(cmd, cwd, timeout_s, *args, **kwargs)
        kind = "link" if "-shared" in cmd else label
        print(f"    {kind:12} {time.perf_counter() - start:6.3f} s  {Path(cmd[0]).name}")
        seen.append(list(cmd))
        return done
    return wrapper


def _link_variants(cmd: list[str], cwd: Path, runs: int) -> None:
    out = Path(tempfile.mkdtemp()) / "probe.so"
    cmd = [*cmd[:-1], str(out)]
    variants = {"as built": cmd,
                "no --no-undefined": [c for c in cmd if c != "-Wl,--no-undefined"]}
    for linker in LINKERS:
        if shutil.which(f"ld.{linker}") or shutil.which(linker):
            variants[f"-fuse-ld={linker}"] = [cmd[0], f"-fuse-ld={linker}", *cmd[1:]]
    for name, variant in variants.items():
        times, rc, errors = [], 0, 0
        for _ in range(runs):
            start = time.perf_counter()
            done = subprocess.run(variant, cwd=cwd, capture_output=True, text=True)
            times.append(time.perf_counter() - start)
            # --noinhibit-exec keeps the exit status at 0: count the errors printed
            rc, errors = done.returncode, (done.stdout + done.stderr).count("error")
        print(f"  link {name:20} median {statistics.median(times):.3f} s  "
              f"all {[round(t, 3) for t in times]}  rc {rc}  errors {errors}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ids", default="12,40")
    parser.add_argument("--iters", type=int, default=3)
    args = parser.parse_args()
    seen: list[list[str]] = []
    nvcc_split.run_command = _timed(nvcc_split.run_command, "compile", seen)
    nvcc_split.compile_cu = _timed(nvcc_split.compile_cu, "nvcc (split)", seen)
    builder = Builder(BuildConfig(device="cuda"))
    for pid in map(int, args.ids.split(",")):
        work = Path(tempfile.mkdtemp()) / "ws"
        shutil.copytree(ROOT / "benchmarks/kernelbench_l1" / CANDIDATES[pid], work)
        for i in range(args.iters + 1):
            for cu in (work / "kernels").glob("*.cu"):
                cu.write_text(cu.read_text() + f"\n// edit {time.time()} {i}\n")
            start = time.perf_counter()
            result = builder.build(work)
            print(f"1/{pid} build {i}: {time.perf_counter() - start:.3f} s ok {result.ok} "
                  f"compiled {list(result.compiled)}", flush=True)
        links = [cmd for cmd in seen if "-shared" in cmd]
        if links:
            _link_variants(links[-1], builder.cache, args.iters)


if __name__ == "__main__":
    main()
