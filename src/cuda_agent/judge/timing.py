"""Time repeated forward calls on the CPU or a CUDA device.

CUDA timing synchronises the whole device (work on any stream counts), flushes the L2
cache before each call and uses CUDA events; CPU timing uses ``time.perf_counter``.
Input sets are rotated between calls.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import torch

from cuda_agent.results import TimingStats

L2_FLUSH_BYTES = 256 * 1024 * 1024


def measure(fn: Callable[..., object], input_sets: Sequence[Sequence[object]], device: str, *,
            warmup: int = 3, min_runs: int = 10, max_runs: int = 200, budget_s: float = 3.0
            ) -> TimingStats:
    """Median and spread of ``fn(*inputs)`` in milliseconds."""
    cuda = device.startswith("cuda")
    flush = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.float32, device=device) if cuda else None
    with torch.no_grad():
        for i in range(warmup):
            fn(*input_sets[i % len(input_sets)])
        _sync(cuda)
        times: list[float] = []
        deadline = time.perf_counter() + budget_s
        while len(times) < max_runs and (len(times) < min_runs or time.perf_counter() < deadline):
            inputs = input_sets[len(times) % len(input_sets)]
            if cuda:
                flush.zero_()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(
                    enable_timing=True)
                torch.cuda.synchronize()
                start.record()
                fn(*inputs)
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end))
            else:
                begin = time.perf_counter()
                fn(*inputs)
                times.append((time.perf_counter() - begin) * 1e3)
    return TimingStats(statistics.median(times), min(times), max(times),
                       statistics.fmean(times), len(times))


def _sync(cuda: bool) -> None:
    if cuda:
        torch.cuda.synchronize()
