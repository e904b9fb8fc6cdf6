"""The verdict under construction, turned into a frozen ``JudgeResult`` at the end."""

from __future__ import annotations

from cuda_agent.judge.config import JUDGE_VERSION
from cuda_agent.judge.reward import milestone_reward
from cuda_agent.results import BuildResult, CorrectnessResult, JudgeResult, TimingStats
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

    def fail(self, *reasons: str) -> JudgeResult:
        self.reasons.extend(reasons)
        self.correct = False
        return self.finish(0.95)

    def finish(self, margin: float) -> JudgeResult:
        reward = milestone_reward(self.correct, self.runtime_ms, self.eager_ms, self.compile_ms,
                                  margin)
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
            time_meaning=self.time_meaning)


def _ratio(base: float | None, value: float | None) -> float | None:
    return base / value if base is not None and value else None
