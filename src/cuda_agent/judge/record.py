"""The verdict under construction, turned into a frozen ``JudgeResult`` at the end."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

from cuda_agent.judge.config import JUDGE_VERSION
from cuda_agent.judge.reward import milestone_reward
from cuda_agent.results import (
    BaselineSource,
    BuildResult,
    CorrectnessResult,
    JudgeResult,
    TimingStats,
)
from cuda_agent.tasks.task import Task


class Verdict:
    """Mutable scratch record of one judgement."""

    def __init__(self, task: Task, device: str, seed: int):
        self.task, self.device, self.seed = task, device, seed
        self.compiled = self.correct = False
        self.reasons: list[str] = []
        self.flags: list[str] = []
        self.runtime_ms: float | None = None
        self.eager_ms: float | None = None
        self.compile_ms: float | None = None
        self.build: BuildResult | None = None
        self.correctness: CorrectnessResult | None = None
        self.timing: TimingStats | None = None
        self.eager_timing: TimingStats | None = None
        self.compile_timing: TimingStats | None = None
        self.time_meaning = ""
        self.profile = ""
        self.isolation = ""
        self.phases: dict[str, float] = {}
        self.doubts: dict[str, str | None] = {}
        """Per baseline ('eager', 'torch.compile'): why a speed-up over it cannot be told
        from noise (``trust.doubt``), None where it can."""
        self.unsettled: dict[str, str] = {}
        """Per baseline: why its figure, measured again after a cached one disagreed with a
        fresh check, still cannot be trusted (``recheck``)."""
        self.baselines: list[BaselineSource] = []
        """Where the baselines came from (``recheck.source``)."""

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Add the wall time of the ``with`` block to phase ``name``."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.phases[name] = self.phases.get(name, 0.0) + time.perf_counter() - start

    def worker_stages(self, role: str, result: dict[str, Any]) -> None:
        """Record how long a worker spent in each of its stages (from its own timestamps)."""
        stages = result.get("stage_at")
        marks = sorted((item for item in (stages.items() if isinstance(stages, dict) else ())
                        if isinstance(item[1], float | int)), key=lambda item: item[1])
        for (name, at), (_, after) in zip(marks, marks[1:], strict=False):
            self.phases[f"{role}.{name}"] = after - at
        details = result.get("timing_details")
        details = details if isinstance(details, dict) else {}
        for part in ("warmup", "timed", "activity", "activity_start"):  # timing stage
            if isinstance(details.get(f"{part}_seconds"), float):
                self.phases[f"{role}.timing.{part}"] = details[f"{part}_seconds"]

    def fail(self, *reasons: str) -> JudgeResult:
        self.reasons.extend(reasons)
        self.correct = False
        return self.finish(0.95)

    def finish(self, margin: float) -> JudgeResult:
        reward = self._trusted(milestone_reward(self.correct, self.runtime_ms, self.eager_ms,
                                                self.compile_ms, margin))
        if self.correct and self.compile_ms is None and self.runtime_ms is not None:
            self.reasons.append("torch.compile baseline not measured: reward capped at 2")
        return JudgeResult(
            task=self.task.name, device=self.device, precision=self.task.precision.value,
            compiled=self.compiled or (self.build is not None and self.build.ok),
            correct=self.correct, reward=reward, reasons=tuple(self.reasons),
            runtime_ms=self.runtime_ms, eager_ms=self.eager_ms, compile_ms=self.compile_ms,
            speedup_vs_eager=_ratio(self.eager_ms, self.runtime_ms),
            speedup_vs_compile=_ratio(self.compile_ms, self.runtime_ms),
            build=self.build, correctness=self.correctness, judge_version=JUDGE_VERSION,
            profile=self.profile, flags=tuple(self.flags), seed=self.seed, timing=self.timing,
            eager_timing=self.eager_timing, compile_timing=self.compile_timing,
            time_meaning=self.time_meaning, isolation=self.isolation,
            phases=tuple((k, round(v, 4)) for k, v in self.phases.items()),
            baselines=tuple(self.baselines))


    def _trusted(self, reward: int) -> int:
        """``reward`` with a milestone whose speed-up noise could explain taken away, and
        the reason why (``trust.doubt``; ``recheck`` for a baseline that stays unsettled)."""
        eager = self.doubts.get("eager") or self.unsettled.get("eager")
        if reward >= 2 and eager:
            self.reasons.append(eager)
            return 1
        if reward == 3 and self.doubts.get("torch.compile"):
            self.reasons.append(self.doubts["torch.compile"])
            return 2
        return reward


def _ratio(base: float | None, value: float | None) -> float | None:
    return base / value if base is not None and value else None
