"""Two evaluation runs compared task by task, correctness first (docs/evaluation.md, "Compare").

    cuda-agent eval compare runs/eval1 runs/eval2

A geomean over correct answers runs over a set that changes with the answers: a run that
loses its slow correct answers raises it. So the comparison leads with the pass rate and the
tasks that regressed (correct in A, wrong in B; a reward that dropped), shows each geomean
beside the one over all tasks (a wrong or untimed answer counting as 1x, no speed-up: the
reference's own time, as a user falling back to it would see) and the one over the tasks
correct in both runs, and calls no run that lost a correct answer a gain.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from cuda_agent.evaluate.audited import record_key
from cuda_agent.evaluate.metrics import TaskRecord, geomean

BASELINES = ("eager", "compile")


@dataclasses.dataclass(frozen=True)
class TaskChange:
    """One task whose verdict differs between the runs."""

    key: str
    reward_a: int
    reward_b: int
    correct_a: bool
    correct_b: bool
    reason_b: str
    """Run B's reason (why it is wrong, or what took its milestone)."""


@dataclasses.dataclass(frozen=True)
class Geomeans:
    """Geometric-mean speed-ups over one baseline, each over a set named by its field."""

    correct_a: float | None
    correct_b: float | None
    """Over each run's own correct timed answers: the sets differ where correctness does."""
    all_a: float | None
    all_b: float | None
    """Over every task of both runs, a wrong or untimed answer counting as 1x."""
    both_a: float | None
    both_b: float | None
    """Over the tasks correct and timed in both runs: the same set on either side."""
    both: int
    """How many tasks that is."""


@dataclasses.dataclass(frozen=True)
class RunComparison:
    """Run B against run A over the tasks both evaluated."""

    tasks: int
    correct_a: int
    correct_b: int
    lost: tuple[TaskChange, ...]
    """Correct in A, wrong in B."""
    gained: tuple[TaskChange, ...]
    """Wrong in A, correct in B."""
    dropped: tuple[TaskChange, ...]
    """Correct in both, a lower reward in B."""
    raised: tuple[TaskChange, ...]
    """Correct in both, a higher reward in B."""
    only_a: tuple[str, ...]
    only_b: tuple[str, ...]
    geomeans: tuple[tuple[str, Geomeans], ...]
    """Per baseline ('eager', 'compile')."""

    @property
    def verdict(self) -> str:
        """One line; a run that lost a correct answer is never called a gain."""
        if self.lost:
            return (f"not a gain: B lost {len(self.lost)} correct answer(s) "
                    f"({self.correct_a} -> {self.correct_b} of {self.tasks} correct)")
        better = [f"{len(self.gained)} newly correct"] if self.gained else []
        better += [f"{len(self.raised)} reward(s) higher"] if self.raised else []
        if self.dropped and not better:
            return f"not a gain: {len(self.dropped)} reward(s) lower, none higher"
        if self.dropped:
            return (f"mixed: no correct answer lost, {', '.join(better)}, "
                    f"{len(self.dropped)} reward(s) lower")
        if better:
            return f"a gain: no correct answer lost, {', '.join(better)}"
        return "no change in correctness or rewards"


def compare_runs(a: Sequence[TaskRecord], b: Sequence[TaskRecord]) -> RunComparison:
    """B against A, matched by task key (``L<level>/<name>``)."""
    by_a = {record_key(r): r for r in a}
    by_b = {record_key(r): r for r in b}
    common = [k for k in by_a if k in by_b]
    pairs = [(k, by_a[k], by_b[k]) for k in common]

    def changes(keep) -> tuple[TaskChange, ...]:
        return tuple(TaskChange(k, ra.reward, rb.reward, ra.correct, rb.correct, rb.reason)
                     for k, ra, rb in pairs if keep(ra, rb))

    return RunComparison(
        tasks=len(common), correct_a=sum(ra.correct for _, ra, _ in pairs),
        correct_b=sum(rb.correct for _, _, rb in pairs),
        lost=changes(lambda ra, rb: ra.correct and not rb.correct),
        gained=changes(lambda ra, rb: rb.correct and not ra.correct),
        dropped=changes(lambda ra, rb: ra.correct and rb.correct and rb.reward < ra.reward),
        raised=changes(lambda ra, rb: ra.correct and rb.correct and rb.reward > ra.reward),
        only_a=tuple(k for k in by_a if k not in by_b),
        only_b=tuple(k for k in by_b if k not in by_a),
        geomeans=tuple((name, _geomeans([(ra, rb) for _, ra, rb in pairs], name))
                       for name in BASELINES))


def _speedup(record: TaskRecord, baseline: str) -> float | None:
    return getattr(record, f"speedup_vs_{baseline}") if record.correct else None


def _geomeans(pairs: list[tuple[TaskRecord, TaskRecord]], baseline: str) -> Geomeans:
    got = [(_speedup(ra, baseline), _speedup(rb, baseline)) for ra, rb in pairs]
    both = [(sa, sb) for sa, sb in got if sa is not None and sb is not None]
    side_a, side_b = [s for s, _ in got], [s for _, s in got]
    return Geomeans(
        correct_a=geomean([s for s in side_a if s is not None]),
        correct_b=geomean([s for s in side_b if s is not None]),
        all_a=_over_all(side_a), all_b=_over_all(side_b),
        both_a=geomean([s for s, _ in both]), both_b=geomean([s for _, s in both]),
        both=len(both))


def _over_all(speedups: list[float | None]) -> float | None:
    """Every task, None (wrong or untimed) as 1x; None where the run timed none over this
    baseline (``--no-compile``): there is nothing to average then."""
    if all(s is None for s in speedups):
        return None
    return geomean([1.0 if s is None else s for s in speedups])


def comparison_markdown(cmp: RunComparison, name_a: str = "A", name_b: str = "B") -> str:
    """The comparison in the order it should be read: verdict, pass rate, regressions,
    then the geomeans over each set."""
    rate = (lambda n: f"{100 * n / cmp.tasks:.1f}%") if cmp.tasks else (lambda n: "-")
    points = 100 * (cmp.correct_b - cmp.correct_a) / cmp.tasks if cmp.tasks else 0.0
    lines = [f"A = {name_a}, B = {name_b}: {cmp.verdict}", "",
             f"pass rate over the {cmp.tasks} tasks of both runs: {cmp.correct_a} -> "
             f"{cmp.correct_b} correct ({rate(cmp.correct_a)} -> {rate(cmp.correct_b)}, "
             f"{points:+.1f} points)"]
    for name, keys in (("only in A", cmp.only_a), ("only in B", cmp.only_b)):
        if keys:
            lines.append(f"{name} (not compared): {len(keys)}: {', '.join(keys[:10])}"
                         + (" ..." if len(keys) > 10 else ""))
    for title, rows in (("Regressions: correct in A, wrong in B", cmp.lost),
                        ("Rewards lower in B (correct in both)", cmp.dropped),
                        ("Newly correct in B", cmp.gained),
                        ("Rewards higher in B", cmp.raised)):
        if rows:
            lines += ["", f"{title} ({len(rows)}):", "", "| task | reward A -> B | B's reason |",
                      "|---|---|---|"]
            lines += [f"| {c.key} | {c.reward_a} -> {c.reward_b} | "
                      f"{c.reason_b.replace('|', '/')[:200]} |" for c in rows]
    lines += ["", "Geomean speed-ups, A -> B, each over the set its column names:", "",
              "| vs | each run's own correct answers (sets differ) | all tasks, a wrong or "
              "untimed answer as 1x | tasks correct in both |", "|---|---|---|---|"]
    for name, g in cmp.geomeans:
        lines.append(f"| {name} | {_x(g.correct_a)} -> {_x(g.correct_b)} | "
                     f"{_x(g.all_a)} -> {_x(g.all_b)} | "
                     f"{_x(g.both_a)} -> {_x(g.both_b)} ({g.both} tasks) |")
    return "\n".join(lines) + "\n"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"
