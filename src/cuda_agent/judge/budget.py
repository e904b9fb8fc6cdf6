"""How many checked outputs a reference reports when they would not fit in memory.

Every trial's outputs, their float64 twins and the timed input sets' outputs travel to the
judge and stay there while the candidate runs. On tasks with outputs of gigabytes (some
KernelBench level-1 problems write 4-6 GB per call) that is more than a GPU holds, so the
reference plans what it reports once it has seen the size of one trial's outputs:

1. float64 twins only for the first trial,
2. one timed input set re-checked instead of all,
3. two trials: the first fresh one and the first scaled one (inputs that differ in seed
   and in scale, so an output that ignores its inputs still fails),
4. no float64 twin (precision then judged by tolerances, and the verdict says so).

Each step is taken only while the total is over the budget; the verdict names what was
dropped. The candidate then runs exactly the trials and timed sets the reference kept.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OutputPlan:
    """What the reference reports: trial indices (in run order), how many of them (from the
    first) carry a float64 twin, and how many timed input sets are re-checked."""

    trials: tuple[int, ...]
    wide: int
    timed: int
    out_bytes: int
    """Bytes of one trial's outputs."""
    reduced: bool

    def note(self, n_trials: int, n_timed: int, budget_bytes: int) -> str:
        """The verdict's flag for a reduced plan."""
        return (f"outputs of {self.out_bytes / 2**30:.2f} GiB per call exceed the output "
                f"budget ({budget_bytes / 2**30:.1f} GiB): {len(self.trials)} of {n_trials} "
                f"trials checked, {self.wide} with a float64 reference, {self.timed} of "
                f"{n_timed} timed input sets re-checked")


def plan_outputs(n_trials: int, n_fresh: int, n_timed: int, out_bytes: int, wide_bytes: int,
                 budget_bytes: int, wide: bool = True) -> OutputPlan:
    """The largest plan within ``budget_bytes`` by the steps of the module docstring (the
    last step's plan when even that is over). Trials ``0..n_fresh-1`` have fresh inputs,
    the rest scaled ones; ``wide_bytes`` is the size of one trial's float64 twin."""
    if n_trials < 1 or not 0 <= n_fresh <= n_trials or n_timed < 0:
        raise ValueError(f"bad trial counts: {n_trials} trials, {n_fresh} fresh, "
                         f"{n_timed} timed")
    priority = [0] + ([n_fresh] if n_fresh < n_trials and n_fresh > 0 else [])
    priority += [i for i in range(n_trials) if i not in priority]
    keep, n_wide, timed = n_trials, n_trials if wide else 0, n_timed

    def cost() -> int:
        return out_bytes * (keep + timed) + wide_bytes * n_wide

    steps = [lambda: (keep, min(n_wide, 1), timed), lambda: (keep, n_wide, min(timed, 1)),
             lambda: (min(keep, 2), n_wide, timed), lambda: (keep, 0, timed)]
    for step in steps:
        if cost() <= budget_bytes:
            break
        keep, n_wide, timed = step()
    n_wide = min(n_wide, keep)
    kept = tuple(sorted(priority[:keep]))
    reduced = keep < n_trials or timed < n_timed or n_wide < (n_trials if wide else 0)
    return OutputPlan(kept, n_wide, timed, out_bytes, reduced)
