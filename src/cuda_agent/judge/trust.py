"""Whether a verdict's times can tell a speed-up from noise (docs/judge.md, "Noisy machines").

A reward above 1 says the candidate is faster; on a loaded or noisy machine the medians can
say so by chance (a baseline timed while something else ran, a candidate timed after it
stopped). So a speed-up earns its milestone only when the comparison is trustworthy:

- each time's 95% interval (candidate and baseline) is within ``trusted_rel_ci`` of its
  median (half-width over median), and its median is above 0;
- on the CPU, where the judge's clock is the time, the judge's clock agrees: its own
  interval of the calls is within ``trusted_rel_ci`` of its median plus
  ``clock_slack_wall_ms``, and it reads the calls no faster than the process's own time
  allows (under ``median / (1 + clock_margin) - clock_slack_wall_ms``, its stand-ins ran
  slower than the calls: the bound on the process's own time bounds nothing then);
- the speed-up's interval lies wholly above 1: the candidate's interval ends below the
  baseline's.

Otherwise the verdict stays correct with the reward below that milestone and a
``timing unreliable: ...`` reason naming the widths and the machine's load. Noise widens
intervals and pulls them together, so it can only take a reward away, whoever makes it.
"""

from __future__ import annotations

import os

from cuda_agent.results import TimingStats


def problems(name: str, timing: TimingStats, meaning: str, cfg) -> list[str]:
    """What makes one time too unsteady to compare (``cfg``: a ``JudgeConfig``)."""
    found = []
    bound = cfg.trusted_rel_ci
    if timing.median_ms <= 0:
        found.append(f"{name}'s median is 0 ms: below what the clock resolves")
    elif timing.rel_ci > bound:
        found.append(f"{name}'s 95% interval {_span(timing.ci_low_ms, timing.ci_high_ms)} is "
                     f"±{timing.rel_ci:.0%} of its median {timing.median_ms:.4g} ms "
                     f"(at most ±{bound:.0%})")
    if meaning != "wall" or timing.clock_ms is None:
        return found
    slack = cfg.clock_slack_wall_ms
    low, high = timing.clock_ci_low_ms, timing.clock_ci_high_ms
    if low is not None and high is not None and (high - low) / 2 > (
            bound * timing.clock_ms + slack):
        found.append(f"the judge's clock of {name}'s calls reads {_span(low, high)} "
                     f"(95% interval, at most ±{bound:.0%} of {timing.clock_ms:.4g} ms "
                     f"+ {slack:g} ms)")
    if timing.clock_ms < timing.median_ms / (1 + cfg.clock_margin) - slack:
        found.append(f"the judge's clock reads {name}'s calls at {timing.clock_ms:.4g} ms "
                     f"against its own {timing.median_ms:.4g} ms: the stand-in calls ran "
                     "slower than the calls themselves")
    return found


def doubt(candidate: TimingStats, baseline: TimingStats, name: str, meaning: str, cfg
          ) -> str | None:
    """Why the candidate's speed-up over the ``name`` baseline cannot be trusted, in one
    line (``timing unreliable: ...``); None where it can."""
    found = problems("the candidate", candidate, meaning, cfg) + problems(
        name, baseline, meaning, cfg)
    if candidate.ci_high_ms >= baseline.ci_low_ms:
        low = baseline.ci_low_ms / candidate.ci_high_ms if candidate.ci_high_ms else 0.0
        high = baseline.ci_high_ms / candidate.ci_low_ms if candidate.ci_low_ms else float("inf")
        found.append(f"the speed-up over {name} lies in {low:.2f}-{high:.2f}x (from the two "
                     "95% intervals), not wholly above 1")
    if not found:
        return None
    return (f"timing unreliable against {name}: " + "; ".join(found) + f"; {load()}: no "
            "speed-up counted over it, judge again on a quieter machine for one")


def load() -> str:
    """The machine's load, as the reasons name it."""
    try:
        minute = os.getloadavg()[0]
    except OSError:
        return "load unknown"
    return f"load average {minute:.2f} over the last minute on {len(os.sched_getaffinity(0))} CPUs"


def _span(low: float, high: float) -> str:
    return f"{low:.4g}-{high:.4g} ms"
