"""Private-stream work under the device timer, call by call (GPU probe).

Times ``torch.sin`` honestly, from a private stream that is never joined, and from a
private stream joined at the end, with a blocker on the calling stream before ``ev0``
(judge-v7) and through the gate (judge-v8, ``device_timer.GATE``; ``late``: ``ev0`` recorded
after the gate's release), for a large and a small tensor. Prints per way: the median
sample, its terms (elapsed(ev0, ev1); how much
``blocker_post`` was delayed; the final sync over the idle reference), where the private
work ended after ``ev0`` (an event on its own stream), the median spread of
``blocker_post``'s block starts (gate) with how many calls it marked unjoined, and the
median of ``measure``; and, for scale, the kernel's time back to back (20 calls between two
events). Run on the GPU machine:

    PYTHONPATH=src python3 benchmarks/judge_v2/side_stream_probe.py [--calls 300]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from cuda_agent.build import BuildConfig, Builder, load_extension
from cuda_agent.judge import device_timer
from cuda_agent.judge.timing import (
    L2_FLUSH_BYTES,
    DeviceTimer,
    Rotation,
    load_blocker,
    measure,
    stats,
)

SIZES = (1 << 25, 1 << 21)


def rotation(n: int) -> Rotation:
    def variant(k: int) -> list[torch.Tensor]:
        gen = torch.Generator(device="cuda").manual_seed(1000 + k)
        return [torch.randn(n, device="cuda", generator=gen)]

    return Rotation(variant, 2)


def back_to_back(n: int, calls: int = 20) -> float:
    x = rotation(n).prepare(0)[0][0]
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(5):
        torch.cuda.synchronize()
        start.record()
        for _ in range(calls):
            torch.sin(x)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return statistics.median(times)


def per_call(fn, blocker, n: int, calls: int, side_end: torch.cuda.Event | None
             ) -> dict[str, float]:
    """The judge's per-call protocol by hand, keeping each call's terms."""
    timer, rot = DeviceTimer(blocker), rotation(n)
    flush = torch.empty(L2_FLUSH_BYTES // 4, device="cuda")
    host = []
    for _ in range(20):  # warm-up; the host time of a call sets blocker_pre's length
        inputs = rot.prepare()[0]
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn(*inputs)
        host.append((time.perf_counter() - start) * 1e3)
        torch.cuda.synchronize()
    timer.calibrate(statistics.median(host))
    ends = []
    for i in range(calls):
        inputs, _ = timer.prepare(rot, None, flush)
        timer.time(fn, inputs)
        if side_end is not None:
            ends.append(timer.events[0].elapsed_time(side_end))
        if i % 3 == 2:
            timer.prepare(rot, None, flush)
            timer.probe_idle()
    rows, idle = timer.rows, timer.idle_ref_ms()
    return {"spread": statistics.median(timer.spreads) if timer.spreads else float("nan"),
            "ref": timer.spread_ref_ms or float("nan"), "unjoined": timer.unjoined(),
            "sample": statistics.median(timer.samples()),
            "main": statistics.median(r[0] for r in rows),
            "tail": statistics.median(max(0.0, r[1] - timer.post_ref_ms) for r in rows),
            "residual": statistics.median(max(0.0, r[2] - idle) for r in rows),
            "end": statistics.median(ends) if ends else float("nan")}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--protocols", default="v7,gate",
                        help="v7 (blockers), gate, late (gate, ev0 after the release)")
    args = parser.parse_args()
    blocker = load_blocker(load_extension(Builder(BuildConfig(device="cuda")).build_tracer()))
    side = torch.cuda.Stream()
    side_end = torch.cuda.Event(enable_timing=True)

    def hostile(x: torch.Tensor) -> torch.Tensor:
        with torch.cuda.stream(side):
            y = torch.sin(x)
            side_end.record()
            return y

    def joined(x: torch.Tensor) -> torch.Tensor:
        y = hostile(x)
        torch.cuda.current_stream().wait_stream(side)
        return y

    for n in SIZES:
        print(f"n {n}: back to back {back_to_back(n):.5f} ms per call")
    print("gate:", blocker.gate)
    print("rep size      gate   way      sample   main     tail     resid    end(ev0) "
          "spread   (ref)    unjoined measure")
    for rep in range(args.reps):
        for n in SIZES:
            for gate in args.protocols.split(","):
                device_timer.GATE = gate != "v7"
                device_timer.EV0_AFTER_OPEN = gate == "late"
                for name, fn, end in (("honest", torch.sin, None),
                                      ("hostile", hostile, side_end),
                                      ("joined", joined, side_end)):
                    row = per_call(fn, blocker, n, args.calls, end)
                    med = stats(measure(fn, rotation(n), "cuda", blocker=blocker, budget_s=1.5,
                                        max_runs=2000).samples).median_ms
                    print(f"{rep}   {n:<9} {gate:6} {name:8} " + " ".join(
                        f"{row[k]:.5f}" for k in ("sample", "main", "tail", "residual", "end",
                                                  "spread", "ref"))
                        + f" {row['unjoined']:3}/{args.calls} {med:.5f}", flush=True)
    device_timer.GATE, device_timer.EV0_AFTER_OPEN = True, False


if __name__ == "__main__":
    main()
