"""Wall time of compiling one ``.cu``: plain nvcc against nvcc's stages run as a graph.

Builds the builder's nvcc command for the source (``-O3 -std=c++17 -lineinfo``, one
``-gencode`` for ``--arch``, ``-fPIC``, the binding headers and the CUDA include folder), run
from the source's workspace (the folder above ``kernels/``), and times it ``-n`` times each
way, alternating plain and split. Prints the median, min and max seconds of each, and says
if the split run fell back to plain nvcc. ``--extra F`` adds two more ways, plain and split
with F appended to the command (say ``--split-compile=0``). Compile only; no GPU needed:

    .venv/bin/python benchmarks/build/nvcc_split_probe.py [SOURCE.cu] --arch 90 -n 5
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from cuda_agent.build import nvcc_split, toolchain
from cuda_agent.paths import TEMPLATES

ROOT = Path(__file__).resolve().parents[2]
DEFAULT = ROOT / "benchmarks/kernelbench_l1/40_LayerNorm/kernels/layer_norm.cu"


def command(nvcc: str, source: Path, arch: str, obj: Path, extra: tuple[str, ...] = ()
            ) -> list[str]:
    """The builder's nvcc command for ``source`` (relative to its workspace)."""
    gencode = f"-gencode=arch=compute_{arch},code=sm_{arch}"
    include = Path(toolchain._cuda_home(nvcc)) / "include"
    return [nvcc, "-O3", "-std=c++17", "-lineinfo", gencode, "-D_GLIBCXX_USE_CXX11_ABI=1",
            "-Xcompiler", "-fPIC", f"-I{TEMPLATES / 'common'}", "-Ikernels", f"-I{include}",
            *extra, "-c", str(source), "-o", str(obj)]


def time_once(split: bool, cmd: list[str], cwd: Path) -> tuple[float, str | None]:
    """Seconds for one compile and, for a split run that fell back, why."""
    start = time.perf_counter()
    run = nvcc_split.compile_cu if split else nvcc_split.run_command
    done = run(cmd, cwd, 600)
    seconds = time.perf_counter() - start
    if not done.ok:
        raise SystemExit(f"compile failed:\n{done.log}")
    return seconds, done.fallback


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", nargs="?", type=Path, default=DEFAULT)
    parser.add_argument("--arch", default="90", help="e.g. 90 or 90a (default 90)")
    parser.add_argument("-n", type=int, default=5, help="compiles each way (default 5)")
    parser.add_argument("--extra", action="append", default=[],
                        help="a flag for the two extra ways (repeatable)")
    args = parser.parse_args()
    nvcc = toolchain.find_nvcc()
    if nvcc is None:
        raise SystemExit("nvcc not found")
    source = args.source.resolve()
    cwd = source.parent.parent if source.parent.name == "kernels" else source.parent
    names = ["plain", "split"] + (["plain+extra", "split+extra"] if args.extra else [])
    times: dict[str, list[float]] = {name: [] for name in names}
    fallbacks: set[str] = set()
    with tempfile.TemporaryDirectory() as out:
        for i in range(args.n):
            for name in names if i % 2 == 0 else names[::-1]:
                extra = tuple(args.extra) if name.endswith("+extra") else ()
                cmd = command(nvcc, source.relative_to(cwd), args.arch, Path(out) / f"{name}.o",
                              extra)
                seconds, fallback = time_once(name.startswith("split"), cmd, cwd)
                times[name].append(seconds)
                fallbacks.update([fallback] if fallback else [])
    print(f"{source.relative_to(ROOT) if source.is_relative_to(ROOT) else source}, "
          f"sm_{args.arch}, {args.n} compiles each"
          + (f"; extra: {' '.join(args.extra)}" if args.extra else ""))
    print("| mode | median s | min s | max s |\n|---|---|---|---|")
    for name, values in times.items():
        print(f"| {name} | {statistics.median(values):.2f} | {min(values):.2f} | "
              f"{max(values):.2f} |")
    for reason in sorted(fallbacks):
        print(f"split fell back to plain nvcc: {reason}")


if __name__ == "__main__":
    main()
