"""A single-file candidate's build: torch's plain ``load_inline`` against the judge's.

For a C++ (``--device cpu``) or CUDA (``--device cuda``) scale-add extension written the
KernelBench way, each round builds a source no build has seen (a fresh comment) three ways:
torch's own ``load_inline`` in a fresh folder, the judge's build (``build.inline``) in a
fresh cache, then the judge's build of the same source again (what a second judgement, or
the judge's next candidate process, costs). Prints each one's wall seconds and the CPU
seconds of the compilers it ran. A CUDA build compiles without a GPU; where torch has no
CUDA libraries (a CPU wheel) both links fail after the compiles, and the probe times the
compiles and says so. Rounds alternate which way goes first:

    .venv/bin/python benchmarks/build/inline_probe.py --device cpu -n 3
    .venv/bin/python benchmarks/build/inline_probe.py --device cuda --arch 90a -n 2
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time
import uuid
from pathlib import Path

import torch.utils.cpp_extension as cpp

from cuda_agent.build import BuildConfig, Builder, symbols
from cuda_agent.build.inline import InlineBuilder, InlineRequest
from cuda_agent.judge.guard import ALLOWED
from cuda_agent.judge.inline_load import inline_request

CPP = """
torch::Tensor scale_add(torch::Tensor x, torch::Tensor y, double alpha) {
  auto out = torch::empty_like(x);
  const float* px = x.data_ptr<float>();
  const float* py = y.data_ptr<float>();
  float* po = out.data_ptr<float>();
  for (int64_t i = 0; i < x.numel(); ++i) po[i] = alpha * px[i] + py[i];
  return out;
}
"""
CUDA_DECLARATION = "torch::Tensor scale_add(torch::Tensor x, torch::Tensor y, double alpha);"
CUDA = """
__global__ void scale_add_kernel(const float* x, const float* y, float* o, long n, float a) {
  long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
  if (i < n) o[i] = a * x[i] + y[i];
}
torch::Tensor scale_add(torch::Tensor x, torch::Tensor y, double alpha) {
  auto out = torch::empty_like(x);
  long n = x.numel();
  scale_add_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(),
                                             out.data_ptr<float>(), n, (float)alpha);
  return out;
}
"""
SHIM = "#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n"
"""The one c10/cuda header torch's CPU wheel lacks (generated at torch's build)."""


def arguments(device: str, tag: str) -> dict:
    """``load_inline``'s arguments for a source no build has seen."""
    if device == "cpu":
        return {"name": "probe_scale_add", "cpp_sources": CPP + f"// {tag}\n",
                "functions": ["scale_add"]}
    return {"name": "probe_scale_add", "cpp_sources": CUDA_DECLARATION,
            "cuda_sources": CUDA + f"// {tag}\n", "functions": ["scale_add"]}


def measured(fn) -> tuple[float, float, str]:
    """(wall seconds, the children's CPU seconds, what went wrong) of ``fn()``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    problem = fn() or ""
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return wall, cpu, problem


def plain(args: dict, shim: Path | None) -> str:
    extra = {"extra_include_paths": [str(shim)]} if shim else {}
    try:
        cpp.load_inline(**args, **extra, build_directory=tempfile.mkdtemp())
    except Exception as exc:  # a CPU wheel: no CUDA libraries to link
        return str(exc).strip().splitlines()[-1][:160]
    return ""


def judged(builder: InlineBuilder, args: dict, filled: dict) -> str:
    request = InlineRequest.parse(inline_request({**filled, **args}))
    done = builder.build(request)
    if done.ok:
        return ""
    found = [line for line in done.log.splitlines() if "error" in line] or [done.log]
    return (f"compiled {','.join(done.compiled) or '-'} cached {','.join(done.cached) or '-'}"
            f"; {found[0][:120]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--arch", default="90a", help="CUDA target (default 90a)")
    parser.add_argument("-n", type=int, default=2, help="rounds (default 2)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="inline-probe-"))
    shim = None
    config = BuildConfig(device=args.device, cache_dir=work / "cache", arch=args.arch)
    if args.device == "cuda":
        cpp.CUDA_HOME = cpp.CUDA_HOME or "/usr/local/cuda"
        os.environ.setdefault("TORCH_CUDA_ARCH_LIST", args.arch[:1] + "." + args.arch[1:2])
        if not (Path(cpp.include_paths("cuda")[0]) / "c10/cuda/impl/cuda_cmake_macros.h"
                ).exists():
            shim = work / "shim"
            (shim / "c10/cuda/impl").mkdir(parents=True)
            (shim / "c10/cuda/impl/cuda_cmake_macros.h").write_text(SHIM)
            config = config.model_copy(update={"extra_cflags": (f"-I{shim}",),
                                               "extra_cuda_cflags": (f"-I{shim}",)})
    filled = {"cuda_sources": None, "functions": None, "extra_cflags": None,
              "extra_cuda_cflags": None, "extra_ldflags": None, "extra_include_paths": None,
              "with_cuda": None, "with_pytorch_error_handling": True}
    for round_ in range(args.n):
        tag = uuid.uuid4().hex
        source = arguments(args.device, tag)
        builder = InlineBuilder(Builder(config.model_copy(
            update={"cache_dir": work / f"cache-{tag}"})), symbols.single_file_policy(ALLOWED))
        ways = [("plain load_inline", lambda s=source: plain(s, shim)),
                ("judge, first build", lambda s=source, b=builder: judged(b, s, filled))]
        for name, fn in ways if round_ % 2 == 0 else ways[::-1]:
            wall, cpu, problem = measured(fn)
            print(f"round {round_ + 1} {name:22s} {wall:7.2f} s wall {cpu:7.2f} s compiler "
                  f"CPU {problem}", flush=True)
        wall, cpu, problem = measured(lambda s=source, b=builder: judged(b, s, filled))
        print(f"round {round_ + 1} {'judge, unchanged':22s} {wall:7.2f} s wall {cpu:7.2f} s "
              f"compiler CPU {problem}", flush=True)


if __name__ == "__main__":
    main()
