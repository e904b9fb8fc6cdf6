"""Can the device's own activity record (CUPTI, through the profiler) see private-stream
work that outlives a timed call? (GPU probe.)

The gate's ``blocker_post`` waits on the judge's stream for an event recorded after the call,
so every kernel the call joined has ended before the post's first block starts. A kernel
that ends after that start ran on a stream the call never joined. The device timer sees
such work only when it delays the post's blocks by more than their usual spread; short work
(``sin`` over 2M floats, about 10 us) mostly escapes it (docs/benchmarks.md, judge-v8).

For each way (``honest``: ``sin`` on the calling stream; ``unjoined``: on a private stream
never joined; ``joined``: on a private stream joined at the end) and size, this times
``--calls`` calls through the gate, first plainly and then with the profiler recording
device activity, and prints: the median elapsed(ev0, ev1) both ways (what recording costs
the timed call), how many calls had device work ending after the post started, and the
largest such overrun (us). With ``--calibrated SPIN`` (repeatable) it also times the
judge-v2 benchmark's calibrated kernel (every thread of a full grid spins SPIN clock64 cycles,
then y = tanh(x) * 0.5 + x over the task's 8M floats), built from benchmarks/judge_v2/
calibrated/candidate: the kernel that was timed about 20% slower in a recorded worker. Run on
the GPU machine from the repository root:

    PYTHONPATH=src python3 benchmarks/judge_v2/cupti_probe.py [--calibrated 0 --calibrated 84846]
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

CALIBRATED = Path(__file__).resolve().parent / "calibrated" / "candidate"

JUDGE_KERNELS = ("judge_gate_kernel", "judge_post_kernel", "judge_block_kernel")


def ways(torch: Any) -> dict[str, Any]:
    private = torch.cuda.Stream()

    def honest(x: Any) -> Any:
        return torch.sin(x)

    def unjoined(x: Any) -> Any:
        private.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(private):
            y = torch.sin(x)
        return y

    def joined(x: Any) -> Any:
        private.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(private):
            y = torch.sin(x)
        torch.cuda.current_stream().wait_stream(private)
        return y

    def spin(x: Any) -> Any:  # compute-bound: 100k SM clock cycles (about 50 us)
        torch.cuda._sleep(100_000)
        return x

    def gemm(x: Any) -> Any:  # compute-bound: fp32 GEMM of 2048 x 2048
        return torch.mm(x, x)

    return {"honest": honest, "unjoined": unjoined, "joined": joined, "spin": spin,
            "gemm": gemm}


def calibrated_model(torch: Any) -> tuple[Any, Any]:
    """The calibrated candidate built by the judge's builder and imported as a worker does,
    and its extension (which also holds the judge's gate, as a candidate's does)."""
    from cuda_agent.build.builder import BuildConfig, Builder, load_extension

    work = Path(tempfile.mkdtemp(prefix="cupti-probe-")) / "candidate"
    shutil.copytree(CALIBRATED, work, ignore=shutil.ignore_patterns("build", "__pycache__"))
    build = Builder(BuildConfig(device="cuda")).build(work)
    if not build.ok:
        raise RuntimeError(f"the calibrated candidate did not build:\n{build.log[-2000:]}")
    extension = load_extension(build.extension_path)
    spec = importlib.util.spec_from_file_location("cupti_probe_model_new", work / "model_new.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module.ModelNew().cuda().eval(), extension


def overruns(events: list[Any]) -> list[float]:
    """Per call (one ``judge_post_kernel`` each): how far (us) the latest device activity
    that started after the call's holder ended past the post's start; 0 when none did."""
    gpu = sorted((e for e in events if e.device_type().name == "CUDA"
                  and e.end_ns() > e.start_ns()), key=lambda e: e.start_ns())
    holders = [e for e in gpu if "judge_gate_kernel" in e.name()]
    posts = [e for e in gpu if "judge_post_kernel" in e.name()]
    out = []
    for holder, post in zip(holders, posts, strict=False):
        work = [e for e in gpu if holder.start_ns() < e.start_ns() < post.start_ns()
                and not any(k in e.name() for k in JUDGE_KERNELS)]
        late = max((e.end_ns() - post.start_ns() for e in work), default=0)
        out.append(max(0, late) / 1e3)
    return out


def call_work(events: list[Any]) -> list[float]:
    """Per call: the summed duration (us) of the device work between its holder and post."""
    gpu = sorted((e for e in events if e.device_type().name == "CUDA"
                  and e.end_ns() > e.start_ns()), key=lambda e: e.start_ns())
    holders = [e for e in gpu if "judge_gate_kernel" in e.name()]
    posts = [e for e in gpu if "judge_post_kernel" in e.name()]
    return [sum(e.end_ns() - e.start_ns() for e in gpu
                if holder.start_ns() < e.start_ns() < post.start_ns()
                and not any(k in e.name() for k in JUDGE_KERNELS)) / 1e3
            for holder, post in zip(holders, posts, strict=False)]


def main() -> int:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from cuda_agent.build.builder import BuildConfig, Builder, load_extension
    from cuda_agent.judge import timing

    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--calibrated", type=int, action="append", default=[],
                        metavar="SPIN", help="also time the calibrated kernel at this spin")
    parser.add_argument("--calibrated-floats", default=str(1 << 23),
                        help="input sizes for the calibrated kernel, comma-separated (its "
                             "grid is one block per 1024 floats, at most 8 per SM)")
    parser.add_argument("--only-calibrated", action="store_true")
    args = parser.parse_args()
    if args.calibrated:  # one extension per process: the candidate's holds the gate too
        model, extension = calibrated_model(torch)
    else:
        extension = load_extension(Builder(BuildConfig(device="cuda")).build_tracer())
    blocker = timing.load_blocker(extension)
    flush = torch.empty(timing.L2_FLUSH_BYTES // 4, device="cuda")
    print(f"{'way':<9} {'floats':>9} {'plain us':>9} {'profiled us':>12} "
          f"{'calls overrun':>14} {'max overrun us':>15}")
    cases: list[tuple[str, int, Any]] = []
    if not args.only_calibrated:
        for n in (1 << 25, 1 << 21, 1 << 22):
            for name, fn in ways(torch).items():
                if not (name in ("spin", "gemm") and n != 1 << 22):
                    cases.append((name, n, fn))
    if args.calibrated:
        for floats in (int(f) for f in args.calibrated_floats.split(",")):
            for spin in args.calibrated:
                def fn(x: Any, spin: int = spin) -> Any:
                    model.spin = spin
                    return model(x)
                cases.append((f"cal{spin}", floats, fn))
    for name, n, fn in cases:
        shape = {1 << 22: (2048, 2048)}.get(n, (n,))
        rotation = timing.Rotation(lambda k, shape=shape: [torch.randn(
            shape, device="cuda", generator=torch.Generator(device="cuda").manual_seed(k))], 2)
        timer = timing.DeviceTimer(blocker)
        with torch.no_grad():
            host = timing._warm_up(fn, rotation, True, 3, 0.2)
            timer.calibrate(statistics.median(host))
            plain = []
            for _ in range(args.calls):
                inputs, _ = timer.prepare(rotation, None, flush)
                plain.append(timer.call(fn, inputs)[1])
            after = []
            profiled = []
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(args.calls):
                    inputs, _ = timer.prepare(rotation, None, flush)
                    profiled.append(timer.call(fn, inputs)[1])
            torch.cuda.synchronize()
            for _ in range(args.calls):  # unrecorded again: does the state persist?
                inputs, _ = timer.prepare(rotation, None, flush)
                after.append(timer.call(fn, inputs)[1])
        events = list(prof.profiler.kineto_results.events())
        over = overruns(events)
        work_us = call_work(events)
        print(f"{name:<9} {n:>9} {statistics.median(plain) * 1e3:>9.2f} "
              f"{statistics.median(profiled) * 1e3:>12.2f} "
              f"(after {statistics.median(after) * 1e3:.2f}) "
              f"{sum(o > 0 for o in over):>7}/{len(over):<6} {max(over, default=0):>15.2f} "
              f"(kernels {statistics.median(work_us) if work_us else 0:.2f} us)",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
