"""Frozen, typed results that flow from the builder and judge to the agent, trainer and eval.

Every result converts to plain JSON with ``to_dict`` and back with ``from_dict``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

T = TypeVar("T")


def to_dict(result: Any) -> dict[str, Any]:
    """Plain-JSON form of any result dataclass (tuples become lists)."""
    return dataclasses.asdict(result)


@dataclasses.dataclass(frozen=True)
class Diagnostic:
    """One compiler message, trimmed for an agent to act on."""

    file: str | None
    line: int | None
    column: int | None
    severity: str
    message: str

    def __str__(self) -> str:
        where = self.file or "<link>"
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        return f"{where}: {self.severity}: {self.message}"


@dataclasses.dataclass(frozen=True)
class BuildResult:
    """Outcome of building a workspace's kernels into the ``cuda_extension`` module."""

    ok: bool
    device: str
    extension_path: str | None
    diagnostics: tuple[Diagnostic, ...] = ()
    compiled: tuple[str, ...] = ()
    cached: tuple[str, ...] = ()
    seconds: float = 0.0
    log: str = ""

    @property
    def errors(self) -> tuple[Diagnostic, ...]:
        return tuple(d for d in self.diagnostics if d.severity in ("error", "fatal error"))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BuildResult:
        diags = tuple(Diagnostic(**d) for d in data.get("diagnostics", ()))
        fields = {**data, "diagnostics": diags}
        for key in ("compiled", "cached"):
            fields[key] = tuple(fields.get(key, ()))
        return cls(**fields)


@dataclasses.dataclass(frozen=True)
class TimingStats:
    """Per-call times of repeated forward calls, in milliseconds.

    ``ci_low_ms``/``ci_high_ms`` bound the median at 95% confidence (order statistics);
    ``iqr_ms`` is the spread of the middle half of the runs.
    """

    median_ms: float
    min_ms: float
    max_ms: float
    mean_ms: float
    runs: int
    ci_low_ms: float = 0.0
    ci_high_ms: float = 0.0
    iqr_ms: float = 0.0
    left_out: int = 0
    """Timed calls not counted (CUDA): the device was disturbed during them, or the host
    queued them late (``late``)."""
    processes: int = 1
    """Fresh processes that timed it (their medians pooled by ``judge.timing.pooled``)."""
    late: int = 0
    """Of ``left_out``: calls the host finished queuing after the timer's holder could open
    (their time would have counted host time)."""
    clock_ms: float | None = None
    """Device time: the judge's own clock's median time of the wall calls, which bounds it
    (``judge.verify.bounded``); None for wall time (the judge's clock already)."""
    clock_ci_low_ms: float | None = None
    clock_ci_high_ms: float | None = None
    """The 95% interval of the judge's own clock's times of the calls (every process's
    counted wall calls together); None where the judge's clock timed none."""

    @property
    def rel_ci(self) -> float:
        """Half-width of the median's confidence interval over the median."""
        return (self.ci_high_ms - self.ci_low_ms) / (2 * self.median_ms) if self.median_ms else 0.0


@dataclasses.dataclass(frozen=True)
class CorrectnessResult:
    """Comparison of candidate outputs with the reference over all checked calls."""

    correct: bool
    trials: int
    """Correctness trials asked for (``JudgeConfig.trials``: checked calls at scale 1)."""
    max_abs_error: float | None
    max_rel_error: float | None
    atol: float
    rtol: float
    reasons: tuple[str, ...] = ()
    checked_calls: int = 0
    """Calls compared in all: the trials, the scaled calls (``JudgeConfig.scales``) and
    those of extra timing processes; fewer trials where a slow task's check budget cut
    them (the verdict's flags say so)."""


@dataclasses.dataclass(frozen=True)
class SizeChange:
    """One size constant of a task that the judge changed to run it (``tasks.sizes``)."""

    name: str
    full: int
    """Its value in the task."""
    judged: int
    """Its value in the task the judge ran."""


@dataclasses.dataclass(frozen=True)
class ShapeResult:
    """The verdict at one of the input shapes a task declares (``INPUT_SHAPES``)."""

    name: str
    correct: bool
    reward: int
    runtime_ms: float | None
    eager_ms: float | None
    compile_ms: float | None
    speedup_vs_eager: float | None
    speedup_vs_compile: float | None
    reasons: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class BaselineSource:
    """Where a verdict's eager and torch.compile baselines came from, and when and where they
    were measured (``judge.recheck``)."""

    source: str
    """'measured' (timed by this judgement), 'cached' (read from the shared cache and held
    to a fresh check), 'remeasured' (cached, but the fresh check disagreed: timed again by
    this judgement) or 'judge' (measured by an earlier judgement of the same judge, kept in
    its memory, and held to a fresh check)."""
    measured_at: str = ""
    """When the figures were measured: UTC, ISO 8601 to the second."""
    load: float | None = None
    """The machine's load average over the minute before they were measured."""
    cpus: int | None = None
    """The CPUs the measuring process could use."""
    device_name: str = ""
    """The device they were measured on (the GPU's name, or the CPU's model and count)."""
    check: TimingStats | None = None
    """The fresh check of eager a cached baseline was held to (a short timing of the
    reference in this judgement); None where none was made."""
    shape: str = ""
    """The input shape they belong to, for a task declaring several (``shapes``)."""


@dataclasses.dataclass(frozen=True)
class JudgeResult:
    """The judge's verdict on one candidate for one task: what the reward is computed from."""

    task: str
    device: str
    precision: str
    compiled: bool
    correct: bool
    reward: int
    reasons: tuple[str, ...]
    runtime_ms: float | None
    eager_ms: float | None
    compile_ms: float | None
    speedup_vs_eager: float | None
    speedup_vs_compile: float | None
    build: BuildResult | None = None
    correctness: CorrectnessResult | None = None
    judge_version: str = ""
    seconds: float = 0.0
    profile: str = ""
    flags: tuple[str, ...] = ()
    seed: int | None = None
    timing: TimingStats | None = None
    eager_timing: TimingStats | None = None
    compile_timing: TimingStats | None = None
    time_meaning: str = ""
    isolation: str = ""
    """How the candidate's process was confined: 'namespaces' (read-only file system, private
    /tmp, no network, own pid namespace) or 'session' (own session only)."""
    phases: tuple[tuple[str, float], ...] = ()
    """Where the judgement's wall time went, in seconds (judge steps and worker stages)."""
    shapes: tuple[ShapeResult, ...] = ()
    """Per-shape verdicts when the task declares several input shapes; the fields above then
    hold the whole set: correct at every shape, times summed over shapes, reward the lowest."""
    size: tuple[SizeChange, ...] = ()
    """The task's size constants the judge reduced to run it on the CPU (``tasks.sizes``,
    ``JudgeConfig.cpu_size``); empty when it ran the task at its own size."""
    baselines: tuple[BaselineSource, ...] = ()
    """Where the baselines of the times above came from (one per input shape); empty when
    nothing was timed."""
