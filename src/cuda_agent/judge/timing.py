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
    """Two input buffers refilled before every call with contents never used before.

    ``variant(j)`` makes input set ``j``: sets 0..``checked``-1 are the ones whose outputs
    the judge re-checks (the last timed calls use them); every other call gets a fresh set
    ``checked + i``, so neither a cache keyed by pointer nor one keyed by contents hits.
    """

    def __init__(self, variant: Callable[[int], list[Any]], checked: int = 2):
        self.variant = variant
        self.checked = checked
        first = variant(0)
        self.buffers = [[x.clone() if isinstance(x, torch.Tensor) else x for x in first]
                        for _ in range(2)]
        self.calls = 0

    def prepare(self, index: int | None = None) -> tuple[list[Any], int]:
        """Fill the next buffer with set ``index`` (default: a fresh one)."""
        k = self.checked + self.calls if index is None else index
        buffer = self.buffers[self.calls % 2]
        self.calls += 1
        with torch.no_grad():
            for dst, src in zip(buffer, self.variant(k), strict=True):
                if isinstance(dst, torch.Tensor):
                    dst.copy_(src)
        return buffer, k


def measure(fn: Callable[..., Any], rotation: Rotation, device: str, *, warmup: int = 3,
            min_runs: int = 10, max_runs: int = 500, budget_s: float = 3.0,
            target_rel_ci: float = 0.005, audit: Callable[[list[Any]], None] | None = None
            ) -> tuple[list[float], list[tuple[int, Any]]]:
    """Time ``fn`` over rotated inputs; return the samples (ms) and the outputs of the two
    final calls, made on the checked input sets, with their set index.

    ``audit``, if given, is called on every fourth set of inputs in an untimed extra call.
    """
    cuda = device.startswith("cuda")
    flush = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.float32, device=device) if cuda else None
    last: list[tuple[int, Any]] = []

    def timed(index: int | None) -> None:
        inputs, k = rotation.prepare(index)
        if cuda:
            flush.zero_()
            _cuda_sync()
        start = _clock()
        out = fn(*inputs)
        if cuda:
            _cuda_sync()
        samples.append((_clock() - start) * 1e3)
        if index is not None:
            last.append((k, out))

    samples: list[float] = []
    with torch.no_grad():
        for _ in range(warmup):
            fn(*rotation.prepare()[0])
        deadline = _clock() + budget_s
        while len(samples) < max_runs:
            if audit is not None and len(samples) % 4 == 3:
                audit(rotation.prepare()[0])
            timed(None)
            if len(samples) >= min_runs:
                result = stats(samples)
                if result.rel_ci <= target_rel_ci or _clock() > deadline:
                    break
        for index in range(rotation.checked):
            timed(index)
    return samples, last


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
