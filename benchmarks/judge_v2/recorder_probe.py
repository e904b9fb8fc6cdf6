"""What starting and stopping the device activity recorder looks like from inside the
process (GPU probe): per cycle, how long starting it took, how long stopping and reading it
took, and the native threads of the process before, while and after (``/proc/self/task``).

The judge records 32 calls after the timed ones (``judge.activity``); a candidate that could
tell that window from the timed calls, by a pause or by new threads, could be honest only
there. Cycle 1 is the first start in the process, as in a worker that never recorded;
later cycles show whether a recorder started once before (a warm-up) leaves nothing to see.
Run on the GPU machine from the repository root:

    PYTHONPATH=src python3 benchmarks/judge_v2/recorder_probe.py [--cycles 4]
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


def main() -> int:
    import torch
    from torch.profiler import ProfilerActivity, profile

    parser = argparse.ArgumentParser()
    parser.add_argument("--cycles", type=int, default=4)
    args = parser.parse_args()
    x = torch.randn(1 << 20, device="cuda")
    torch.sin(x)
    torch.cuda.synchronize()
    print(f"{'cycle':>5} {'threads before':>14} {'start ms':>9} {'threads on':>10} "
          f"{'stop+read ms':>12} {'threads after':>13} {'kernels':>8}")
    for cycle in range(1, args.cycles + 1):
        before = threads()
        start = time.perf_counter()
        prof = profile(activities=[ProfilerActivity.CUDA])
        prof.__enter__()
        started = time.perf_counter()
        during = threads()
        for _ in range(8):
            torch.sin(x)
        torch.cuda.synchronize()
        stop = time.perf_counter()
        prof.__exit__(None, None, None)
        kernels = sum(e.device_type().name == "CUDA"
                      for e in prof.profiler.kineto_results.events())
        stopped = time.perf_counter()
        print(f"{cycle:>5} {before:>14} {(started - start) * 1e3:>9.2f} {during:>10} "
              f"{(stopped - stop) * 1e3:>12.2f} {threads():>13} {kernels:>8}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
