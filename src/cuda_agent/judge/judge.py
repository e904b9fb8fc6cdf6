"""Judge a candidate against a task: build, check, time, reward.

    cuda-agent judge ../shared/kernelbench/kernelbench.jsonl::1/19 my_workspace --json

Reference, torch.compile baseline and candidate each run in a fresh process. Reference
outputs are read back into the judge and deleted from disk before the candidate starts;
the comparison happens here, in the judge's process.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from cuda_agent.build.builder import Builder
from cuda_agent.judge.candidate import Candidate, CandidateError
from cuda_agent.judge.compare import compare_trials
from cuda_agent.judge.config import JUDGE_VERSION, JudgeConfig
from cuda_agent.judge.reward import milestone_reward
from cuda_agent.judge.runner import WorkerOutcome, run_worker
from cuda_agent.judge.worker import without_model
from cuda_agent.results import BuildResult, CorrectnessResult, JudgeResult
from cuda_agent.tasks.task import Task


class JudgeError(RuntimeError):
    """The judgement could not be made (e.g. the reference itself fails): not a verdict."""


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise JudgeError("--device cuda asked for, but torch sees no CUDA device")
    return device


class Judge:
    """Stateless apart from its config; one instance may judge many candidates."""

    def __init__(self, config: JudgeConfig | None = None):
        self.config = config or JudgeConfig()
        self.device = resolve_device(self.config.device)
        build = self.config.build.model_copy(update={"device": self.device})
        self.builder = Builder(build)

    def judge(self, task: Task, candidate: Candidate, profile: bool = False) -> JudgeResult:
        start = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="cuda-agent-judge-") as tmp:
            result = self._judge(task, candidate, Path(tmp), profile)
        return dataclasses.replace(result, seconds=time.perf_counter() - start)

    def _judge(self, task: Task, candidate: Candidate, tmp: Path, profile: bool) -> JudgeResult:
        verdict = _Verdict(task, self.device)
        try:
            snapshot = candidate.snapshot(tmp / "candidate")
        except CandidateError as exc:
            return verdict.fail(f"candidate rejected: {exc}")
        build: BuildResult | None = None
        if candidate.kind == "workspace":
            build = self.builder.build(snapshot)
            verdict.build = build
            if not build.ok:
                first = "; ".join(str(d) for d in build.errors[:3]) or "see build log"
                return verdict.fail(f"build failed: {first}")
        ref = self._run("reference", task, tmp, check=self.config.check)
        if not ref.ok:
            raise JudgeError(f"reference failed for task {task.name}: {ref.failure}\n"
                             f"{ref.stderr_tail[-800:]}")
        reference = self._collect(tmp / "reference")
        cand = self._run("candidate", task, tmp, check=self.config.check,
                         candidate_dir=str(snapshot), profile=profile,
                         extension=build.extension_path if build else None)
        verdict.compiled = cand.ok or cand.result.get("stage") not in (None, "start", "load")
        if not cand.ok:
            return verdict.fail(f"candidate failed: {cand.failure}")
        verdict.profile = cand.result.get("profile", "")
        if self.config.check:
            outputs = self._collect(tmp / "candidate_run")
            verdict.correctness = compare_trials(reference, outputs, self.config.atol,
                                                 self.config.rtol)
            if not verdict.correctness.correct:
                return verdict.fail(*verdict.correctness.reasons)
        verdict.correct = self.config.check
        if self.config.time:
            verdict.runtime_ms = cand.result["timing"]["median_ms"]
            verdict.eager_ms = ref.result["timing"]["median_ms"]
            if self.config.time_compile:
                comp = self._run("compile", task, tmp, check=False)
                if comp.ok:
                    verdict.compile_ms = comp.result["timing"]["median_ms"]
                else:
                    verdict.reasons.append(f"torch.compile baseline failed: {comp.failure}")
        return verdict.finish(self.config.faster_margin)

    def _run(self, role: str, task: Task, tmp: Path, check: bool, **extra: Any) -> WorkerOutcome:
        cfg = self.config
        out = tmp / ("candidate_run" if role == "candidate" else role)
        code = without_model(task.code) if role == "candidate" else task.code
        job = {"role": role, "task_code": code, "device": self.device, "seed": cfg.seed,
               "trials": cfg.trials, "check": check, "time": cfg.time,
               "precision": task.precision.value, "state_path": str(tmp / "state.pt"),
               "timing": {"warmup": cfg.warmup if role != "compile" else max(cfg.warmup, 2),
                          "min_runs": cfg.min_runs, "max_runs": cfg.max_runs,
                          "budget_s": cfg.time_budget_s}, **extra}
        return run_worker(job, out, cfg.process_timeout_s)

    def _collect(self, folder: Path) -> list[list[Any]]:
        outputs = []
        for trial in range(self.config.trials if self.config.check else 0):
            path = folder / f"outputs_{trial}.pt"
            try:
                outputs.append(torch.load(path, weights_only=True))
            except Exception as exc:
                raise JudgeError(f"unreadable outputs {path.name}: {exc}") from None
            path.unlink()
        shutil.rmtree(folder, ignore_errors=True)
        return outputs


class _Verdict:
    """Mutable scratch record turned into a frozen JudgeResult at the end."""

    def __init__(self, task: Task, device: str):
        self.task, self.device = task, device
        self.compiled = self.correct = False
        self.reasons: list[str] = []
        self.runtime_ms = self.eager_ms = self.compile_ms = None
        self.build: BuildResult | None = None
        self.correctness: CorrectnessResult | None = None
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
            profile=self.profile)


def _ratio(base: float | None, value: float | None) -> float | None:
    return base / value if base is not None and value else None
