"""Calls queued late, call by call (GPU probe).

A candidate whose host stalls ``--stall-us`` before launching, in one call of ``--every``,
is timed ``--runs`` times with the judge's ``measure`` (gate, flush, rotated inputs); for
each run it prints every timed call: whether it stalled, the host time from arming the gate
to ``ev1`` (us), the holder's wait ``pre_ns`` (us) at that call, elapsed(ev0, ev1) (ms),
whether the call counted as exposed and whether it was kept. A stalled call that was kept
with its stall in its time is marked ``<<``. Run on the GPU machine from the repository
root:

    PYTHONPATH=src python3 benchmarks/judge_v2/late_probe.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any


def main() -> int:
    import torch
    from side_stream_probe import rotation  # sin's inputs: two sets of n floats

    from cuda_agent.build.builder import BuildConfig, Builder, load_extension
    from cuda_agent.judge import device_timer, timing

    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=6)
    parser.add_argument("--every", type=int, default=7)
    parser.add_argument("--stall-us", type=float, default=300.0)
    args = parser.parse_args()
    blocker = timing.load_blocker(load_extension(Builder(BuildConfig(device="cuda"))
                                                 .build_tracer()))
    n = 1 << 25
    calls = [0]
    log: list[dict[str, Any]] = []

    def stalling(x: torch.Tensor) -> torch.Tensor:
        calls[0] += 1
        stalled = calls[0] % args.every == 0
        if stalled:
            time.sleep(args.stall_us / 1e6)
        log.append({"stalled": stalled})
        return torch.sin(x)

    plain_call = device_timer.DeviceTimer.call

    def call(self: Any, fn: Any, inputs: list[Any]) -> Any:
        pre_ns, armed = self.pre_ns, time.perf_counter()
        before = len(log)
        out = plain_call(self, fn, inputs)
        if len(log) > before:  # a call of the candidate, not a probe
            log[-1].update(pre_us=pre_ns / 1e3, main=out[1], exposed=self._last_exposed,
                           host_us=(time.perf_counter() - armed) * 1e6)
        return out

    device_timer.DeviceTimer.call = call

    for run in range(args.runs):
        log.clear()
        result = timing.measure(stalling, rotation(n), "cuda", blocker=blocker, budget_s=2.0,
                                max_runs=2000)
        timer_rows = [r for r in log if "main" in r]
        base = statistics.median(r["main"] for r in timer_rows if not r["stalled"])
        d = result.details
        print(f"== run {run}: calls {d['calls']} exposed {d['exposed']} late {d['late']} "
              f"pre_ns {d['pre_ns']} disturbed {d['disturbed']}; max sample "
              f"{max(result.samples):.4f} ms, honest {base:.4f} ms", flush=True)
        for i, r in enumerate(timer_rows):
            counted = r["main"] > 1.5 * base
            if r["stalled"] or r["exposed"] or counted:
                print(f"  call {i:3d} stalled {r['stalled']!s:5} host {r['host_us']:7.1f} us "
                      f"pre {r['pre_us']:7.1f} us main {r['main']:.4f} ms exposed "
                      f"{r['exposed']!s:5}{' <<' if counted and not r['exposed'] else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
