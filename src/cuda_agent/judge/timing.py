"""Time repeated forward calls, the same way for candidate and baselines (judge-v2).

What a time means (``TIME_MEANING``): per-call wall time between device-wide
synchronisations, so work on any stream or host thread counts; on CUDA the L2 cache is
flushed before each call. Calls alternate between two input buffers whose contents are
replaced before every call (a cache keyed by pointer returns stale answers, which the judge
then catches when it re-checks the outputs of the last timed calls). Runs repeat until the
95% confidence interval of the median is within ``target_rel_ci`` or the budget is spent.

Clocks and the synchronise function are bound at import, before any candidate code runs;
the judge process also cross-checks the total with its own clock.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from cuda_agent.results import TimingStats

TIME_MEANING = ("per-call wall time between device-wide synchronisations (all streams and "
                "threads count); L2 flushed before each call on CUDA; inputs rotated between "
                "two buffers refilled with new contents before every call; median with a 95% "
                "confidence interval")
L2_FLUSH_BYTES = 256 * 1024 * 1024
_clock = time.perf_counter
_cuda_sync = torch.cuda.synchronize


def median_ci(samples: Sequence[float], z: float = 1.96) -> tuple[float, float]:
    """Distribution-free confidence interval of the median from order statistics."""
    ordered = sorted(samples)
    n = len(ordered)
    half = z * math.sqrt(n) / 2
    lo = max(0, math.floor(n / 2 - half))
    hi = min(n - 1, math.ceil(n / 2 + half) - 1)
    return ordered[lo], ordered[hi]


def stats(samples: Sequence[float]) -> TimingStats:
    lo, hi = median_ci(samples)
    quart = statistics.quantiles(samples, n=4) if len(samples) >= 2 else [samples[0]] * 3
    return TimingStats(statistics.median(samples), min(samples), max(samples),
                       statistics.fmean(samples), len(samples), lo, hi, quart[2] - quart[0])


class Rotation:
    """Two input buffers; before call ``i`` buffer ``i % 2`` gets variant ``i % n`` contents."""

    def __init__(self, variant: Callable[[int], list[Any]], n_variants: int = 3,
                 cache_bytes: int = 1 << 30):
        self.variant = variant
        self.n = n_variants
        first = variant(0)
        size = sum(x.numel() * x.element_size() for x in first if isinstance(x, torch.Tensor))
        self.cached = [first, *(variant(k) for k in range(1, n_variants))] \
            if size * n_variants <= cache_bytes else None
        self.buffers = [[x.clone() if isinstance(x, torch.Tensor) else x for x in first]
                        for _ in range(2)]

    def prepare(self, i: int) -> tuple[list[Any], int]:
        k = i % self.n
        source = self.cached[k] if self.cached is not None else self.variant(k)
        buffer = self.buffers[i % 2]
        with torch.no_grad():
            for dst, src in zip(buffer, source, strict=True):
                if isinstance(dst, torch.Tensor):
                    dst.copy_(src)
        return buffer, k


def measure(fn: Callable[..., Any], rotation: Rotation, device: str, *, warmup: int = 3,
            min_runs: int = 10, max_runs: int = 500, budget_s: float = 3.0,
            target_rel_ci: float = 0.005, audit: Callable[[list[Any]], None] | None = None
            ) -> tuple[TimingStats, list[tuple[int, Any]]]:
    """Time ``fn`` over rotated inputs; return stats and the last outputs with their variant.

    ``audit``, if given, is called on every fourth set of inputs in an untimed extra call.
    """
    cuda = device.startswith("cuda")
    flush = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.float32, device=device) if cuda else None
    last: list[tuple[int, Any]] = []
    with torch.no_grad():
        for i in range(warmup):
            fn(*rotation.prepare(i)[0])
        samples: list[float] = []
        deadline = _clock() + budget_s
        i = 0
        while len(samples) < max_runs:
            inputs, k = rotation.prepare(i)
            if audit is not None and i % 4 == 3:
                audit(inputs)
                inputs, k = rotation.prepare(i)
            if cuda:
                flush.zero_()
                _cuda_sync()
            start = _clock()
            out = fn(*inputs)
            if cuda:
                _cuda_sync()
            samples.append((_clock() - start) * 1e3)
            last = [*last[-1:], (k, out)]
            i += 1
            if len(samples) >= min_runs:
                result = stats(samples)
                if result.rel_ci <= target_rel_ci or _clock() > deadline:
                    break
    return stats(samples), last


def crosscheck(fn: Callable[..., Any], inputs: list[Any], device: str, calls: int,
               mark: Callable[[str], None]) -> float:
    """Back-to-back calls between two marks the judge process timestamps; returns ms/call."""
    cuda = device.startswith("cuda")
    with torch.no_grad():
        if cuda:
            _cuda_sync()
        mark("start")
        start = _clock()
        for _ in range(calls):
            fn(*inputs)
        if cuda:
            _cuda_sync()
        elapsed = _clock() - start
        mark("end")
    return elapsed * 1e3 / calls
