"""How many calls the judge keeps when their outputs would not fit in memory.

Every kept call's outputs and inputs (read from the candidate's pack), the reference's
outputs for it and, for the first ones, their float64 twins stay in the judge's memory
until the comparison. On tasks with outputs of gigabytes (some KernelBench level-1 problems
write 4-6 GB per call) that is more than a GPU holds, so once the reference has reported
one call's sizes the judge plans what it keeps, within ``output_budget_gb``:

1. float64 twins only for the first kept call,
2. one kept call in each extra timing process instead of several,
3. two checked calls in the first process: one at scale 1 and the first scaled one (inputs
   that differ in seed and in scale, so an output that ignores its inputs still fails), or
   two at scale 1 where there are no scales,
4. no float64 twin (precision then judged by tolerances, and the verdict says so).

Each step is taken only while the total is over the budget; the verdict names what was
dropped.

The same steps but the last bound the time the checks take where ``check_budget_s`` asks
(the agent's own verify and profile: ``config.IN_EPISODE``): on a task whose call takes a
second on the CPU, seven checked calls, each with the reference's answer and its float64
twin, take over a minute. ``fit_time`` estimates that time from the reference's first call;
the float64 twin of the first checked call always stays, so precision is still judged
against float64, on fewer calls.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class KeptPlan:
    """What the judge keeps: calls at scale 1 in the first process (``keep``), the scaled
    calls, calls in each extra process, and how many of the first process's (in call
    order) get a float64 twin."""

    keep: int
    scales: tuple[float, ...]
    extra: int
    wide: int
    call_bytes: int
    """Bytes one kept call holds (its outputs and inputs, the reference's outputs)."""
    reduced: bool

    def note(self, planned: KeptPlan, budget_bytes: int) -> str:
        """The verdict's flag for a reduced plan."""
        return (f"a call's outputs and inputs take {self.call_bytes / 2**30:.2f} GiB, over "
                f"the output budget ({budget_bytes / 2**30:.1f} GiB) for every check: "
                f"{self.keep + len(self.scales)} of {planned.keep + len(planned.scales)} "
                f"calls checked in the first process, {self.wide} with a float64 reference, "
                f"{self.extra} of {planned.extra} in each other timing process")


def plan_kept(keep: int, scales: tuple[float, ...], extra: int, processes: int,
              call_bytes: int, wide_bytes: int, budget_bytes: int, wide: bool = True
              ) -> KeptPlan:
    """The largest plan within ``budget_bytes`` by the steps of the module docstring (the
    last step's plan when even that is over). ``call_bytes``: one kept call's outputs,
    inputs and reference outputs; ``wide_bytes``: its float64 twin."""
    if keep < 1 or extra < 0 or processes < 1:
        raise ValueError(f"bad plan: keep {keep}, extra {extra}, processes {processes}")
    first = keep + len(scales)
    n_wide = first if wide else 0
    planned = (keep, scales, extra, n_wide)

    def cost(plan: tuple[int, tuple[float, ...], int, int]) -> int:
        k, s, e, w = plan
        return call_bytes * (k + len(s) + e * (processes - 1)) + wide_bytes * w

    steps = [lambda p: (p[0], p[1], p[2], min(p[3], 1)),
             lambda p: (p[0], p[1], min(p[2], 1), p[3]),
             lambda p: (1 if p[1] else 2, p[1][:1], p[2], min(p[3], 2)),
             lambda p: (p[0], p[1], p[2], 0)]
    plan = planned
    for step in steps:
        if cost(plan) <= budget_bytes:
            break
        plan = step(plan)
    k, s, e, w = plan
    w = min(w, k + len(s))
    return KeptPlan(k, s, e, w, call_bytes, (k, s, e, w) != planned)


CHECK_CALLS = 3.0
"""What one checked call costs, in calls of the reference: the candidate's call, the
reference's answer, and making, packing and digesting its inputs on both sides."""
WIDE_CALLS = 3.0
"""What a float64 twin adds, in calls of the reference (float64 runs 2-3x slower)."""


def fit_time(plan: KeptPlan, processes: int, call_s: float, budget_s: float
             ) -> tuple[KeptPlan, str | None]:
    """``plan`` by steps 1-3 of the module docstring while its checks would take more than
    ``budget_s`` at ``call_s`` a reference call (``CHECK_CALLS``, ``WIDE_CALLS``), and the
    verdict's note when a step was taken (None otherwise). Step 4 is never taken for time:
    the first checked call keeps its float64 twin."""
    def cost(p: tuple[int, tuple[float, ...], int, int]) -> float:
        k, s, e, w = p
        return call_s * (CHECK_CALLS * (k + len(s) + e * (processes - 1)) + WIDE_CALLS * w)

    steps = [lambda p: (p[0], p[1], p[2], min(p[3], 1)),
             lambda p: (p[0], p[1], min(p[2], 1), p[3]),
             lambda p: (1 if p[1] else 2, p[1][:1], p[2], min(p[3], 1))]
    start = (plan.keep, plan.scales, plan.extra, plan.wide)
    fitted = start
    for step in steps:
        if cost(fitted) <= budget_s:
            break
        fitted = step(fitted)
    if fitted == start:
        return plan, None
    k, s, e, w = fitted
    others = f", {e} of {plan.extra} in each other timing process" if processes > 1 else ""
    note = (f"a reference call takes {call_s:.2f} s: {k + len(s)} of "
            f"{plan.keep + len(plan.scales)} calls checked in the first process, "
            f"{min(w, k + len(s))} with a float64 reference{others}, to keep the checks "
            f"within check_budget_s ({budget_s:g} s)")
    return dataclasses.replace(plan, keep=k, scales=s, extra=e, wide=min(w, k + len(s)),
                               reduced=True), note
