"""Which statistic of a process's timed calls agrees best from one process to the next?
(Offline: reads the JSON of ``clock_probe.py --json``, whose blocks keep every call's time.)

For each target and way, every process's calls are reduced by each estimator below; the
table gives, per estimator, the spread ((max - min) / median) and the standard deviation
(over the mean) of the processes' values. Where every estimator's processes disagree by more
than their calls' own sampling noise (``boot SE``: the bootstrap standard error of one
process's median), the part left is the process's own and no statistic of its calls removes
it. ``flush-scaled`` divides each process's median by its median L2-flush time (a fixed
256 MiB write in the same process) and multiplies by the median over processes: if device
memory ran slower in some processes, this would cancel it. With ``clock_probe --variants
empty``, the gate's own time per process (an empty call, and a fixed 20 us spin, through the
gate) is set against the calls' medians: if the gate's time moved from process to process,
the calls' medians less it would agree better.

    python3 benchmarks/judge_v2/estimator_probe.py OUT/clock.json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from judge_gpu import sd_pct as _sd
from judge_gpu import spread_pct as _spread


def _quantile(q: float) -> Callable[[list[float]], float]:
    def at(xs: list[float]) -> float:
        s = sorted(xs)
        return s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))]
    return at


def _trimmed(frac: float) -> Callable[[list[float]], float]:
    def mean(xs: list[float]) -> float:
        s = sorted(xs)
        k = int(len(s) * frac)
        return statistics.fmean(s[k:len(s) - k])
    return mean


def _shorth(xs: list[float]) -> float:
    """Midpoint of the shortest interval holding half the calls."""
    s = sorted(xs)
    h = len(s) // 2
    i = min(range(len(s) - h), key=lambda j: s[j + h] - s[j])
    return (s[i] + s[i + h]) / 2


ESTIMATORS: dict[str, Callable[[list[float]], float]] = {
    "median": statistics.median,
    "mean": statistics.fmean,
    "trimmed 25%": _trimmed(0.25),
    "p10": _quantile(0.10),
    "p25": _quantile(0.25),
    "min": min,
    "shorth": _shorth,
}


def _boot_se(xs: list[float], rounds: int = 200) -> float:
    rng = random.Random(0)
    meds = [statistics.median(rng.choices(xs, k=len(xs))) for _ in range(rounds)]
    return statistics.stdev(meds) / statistics.median(xs) * 100


def analyse(name: str, runs: list[dict[str, Any]]) -> list[str]:
    calls = [[c for b in r["blocks"] for c in b.get("calls", [])] for r in runs]
    calls = [c for c in calls if c]
    if len(calls) < 3:
        return []
    flushes = [statistics.median(f for b in r["blocks"] for f in b.get("flushes", []))
               for r in runs if r["blocks"][0].get("flushes")]
    lines = [f"== {name}: {len(calls)} processes, {len(calls[0])} calls each; "
             f"boot SE of a median {statistics.median(_boot_se(c) for c in calls):.3f}%"]
    for label, est in ESTIMATORS.items():
        vals = [est(c) for c in calls]
        lines.append(f"  {label:12s} spread {_spread(vals):5.2f}%  SD {_sd(vals):5.2f}%   "
                     + " ".join(f"{v:.5f}" for v in vals))
    if len(flushes) == len(calls):
        meds = [statistics.median(c) for c in calls]
        mid = statistics.median(flushes)
        scaled = [m / f * mid for m, f in zip(meds, flushes, strict=True)]
        corr = statistics.correlation(meds, flushes) if statistics.pstdev(flushes) else 0.0
        lines.append(f"  flush-scaled spread {_spread(scaled):5.2f}%  SD {_sd(scaled):5.2f}%"
                     f"   (flush medians spread {_spread(flushes):.2f}%, corr with medians "
                     f"{corr:+.2f})")
    meds = [statistics.median(c) for c in calls]
    lines.extend(_bursts(runs, meds))
    for series, known in (("empties", 0.0), ("spins", 0.020)):
        per = [[x for b in r["blocks"] for x in b.get(series, [])] for r in runs]
        if len(per) != len(calls) or not all(per):
            continue
        own = [statistics.median(x) - known for x in per]  # the gate's part (ms)
        less = [m - o for m, o in zip(meds, own, strict=True)]
        corr = statistics.correlation(meds, own) if statistics.pstdev(own) else 0.0
        lines.append(f"  {series:8s} less their work {' '.join(f'{o * 1e3:.3f}' for o in own)} us; "
                     f"corr with the calls' medians {corr:+.2f}; calls less {series}: spread "
                     f"{_spread(less):.2f}% SD {_sd(less):.2f}%")
    return lines


def _bursts(runs: list[dict[str, Any]], meds: list[float]) -> list[str]:
    """With ``clock_probe --burst K``: is the processes' spread shared by neighbours (one
    round's K processes, run back to back) or each process's own? If each process's own,
    the rounds' means vary by the within-round SD over sqrt(K)."""
    rounds: dict[int, list[float]] = {}
    for run, med in zip(runs, meds, strict=False):
        if "round" in run:
            rounds.setdefault(run["round"], []).append(med)
    groups = [g for g in rounds.values() if len(g) >= 2]
    if len(groups) < 3:
        return []
    k = statistics.median(len(g) for g in groups)
    within = statistics.fmean(statistics.variance(g) for g in groups) ** 0.5
    means = [statistics.fmean(g) for g in groups]
    between = statistics.stdev(means)
    mid = statistics.fmean(means)
    return [f"  bursts of {k:g}: within-round SD {within / mid * 100:.2f}%, rounds' means SD "
            f"{between / mid * 100:.2f}% (own parts alone would give "
            f"{within / k ** 0.5 / mid * 100:.2f}%); rounds' means spread "
            f"{_spread(means):.2f}%"]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("report", type=Path, help="clock_probe.py's --json output")
    args = parser.parse_args()
    report = json.loads(args.report.read_text())
    for name, runs in report.items():
        for line in analyse(name, runs):
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
