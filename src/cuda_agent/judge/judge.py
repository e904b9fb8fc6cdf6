"""Judge a candidate against a task: check sources, build, verify, time, reward (judge-v2).

    cuda-agent judge ../shared/kernelbench/kernelbench.jsonl::1/19 my_workspace --json

The reference, the torch.compile baseline and the candidate each run in a fresh process
(started at once, so their start-up overlaps the build). The candidate's job has no
reference ``Model``; reference outputs are read into this process and deleted from disk
before the candidate starts; all comparison happens here. See docs/judge.md.
"""

from __future__ import annotations

import dataclasses
import secrets
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from cuda_agent.build.builder import Builder
from cuda_agent.judge import baselines as baseline_cache
from cuda_agent.judge.candidate import Candidate, CandidateError
from cuda_agent.judge.config import JUDGE_VERSION, JudgeConfig
from cuda_agent.judge.record import Verdict
from cuda_agent.judge.runner import Worker, WorkerOutcome
from cuda_agent.judge.static_check import check_source
from cuda_agent.judge.timing import stats
from cuda_agent.judge.verify import check_outputs, check_timing
from cuda_agent.judge.worker import without_model
from cuda_agent.results import JudgeResult
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
        self.builder = Builder(self.config.build.model_copy(update={"device": self.device}))

    def judge(self, task: Task, candidate: Candidate, profile: bool = False) -> JudgeResult:
        start = time.perf_counter()
        seed = self.config.seed if self.config.seed is not None else secrets.randbelow(2**30)
        with tempfile.TemporaryDirectory(prefix="cuda-agent-judge-") as tmp:
            result = self._judge(task, candidate, Path(tmp), seed, profile)
        return dataclasses.replace(result, seconds=time.perf_counter() - start)

    def _judge(self, task: Task, candidate: Candidate, tmp: Path, seed: int, profile: bool
               ) -> JudgeResult:
        cfg = self.config
        verdict = Verdict(task, self.device, seed)
        try:
            snapshot = candidate.snapshot(tmp / "candidate")
        except CandidateError as exc:
            return verdict.fail(f"candidate rejected: {exc}")
        problems = check_source((snapshot / "model_new.py").read_text())
        if problems:
            return verdict.fail(*(f"static check: {p}" for p in problems))
        plan = _Plan(cfg, task, self.device, seed, tmp)
        ref_worker, cand_worker = self._worker(tmp / "reference"), self._worker(tmp / "cand")
        try:
            if candidate.kind == "workspace":
                verdict.build = self.builder.build(snapshot)
                if not verdict.build.ok:
                    first = "; ".join(str(d) for d in verdict.build.errors[:3]) or "see log"
                    return verdict.fail(f"build failed: {first}")
            cached = plan.cached_baselines() if cfg.time else None
            ref = ref_worker.run(plan.job("reference", time=cfg.time and cached is None,
                                          bandwidth=cfg.time and cached is None),
                                 cfg.process_timeout_s)
            ref_worker = None
            if not ref.ok:
                raise JudgeError(f"reference failed for task {task.name}: {ref.failure}\n"
                                 f"{ref.stderr_tail[-800:]}")
            base = cached or self._measure_baselines(plan, ref)
            reference = plan.collect_reference()
            reference["io_bytes"] = ref.result.get("io_bytes")
            extension = verdict.build.extension_path if verdict.build else None
            tracer = None if extension else self.builder.build_tracer()
            cand = cand_worker.run(plan.job("candidate", candidate_dir=str(snapshot),
                                            extension=extension, tracer=tracer,
                                            profile=profile), cfg.process_timeout_s)
            cand_worker = None
        finally:
            for worker in (ref_worker, cand_worker):
                if worker is not None:
                    worker.cancel()
        verdict.compiled = cand.ok or cand.result.get("stage") not in (None, "start", "load")
        if cand.leftover:
            verdict.reasons.append(f"candidate left {cand.leftover} process(es) running "
                                   "(killed)")
        if not cand.ok:
            return verdict.fail(f"candidate failed: {cand.failure}")
        verdict.profile = cand.result.get("profile", "")
        if cfg.check:
            outputs = plan.collect_candidate()
            if not check_outputs(verdict, reference, outputs, task.precision.value, cfg):
                return verdict.finish(cfg.faster_margin)
        verdict.correct = cfg.check and not cand.leftover
        if cfg.time and verdict.correct:
            check_timing(verdict, cand, base, reference, plan.collect_timed(), cfg)
        return verdict.finish(cfg.faster_margin)

    def _worker(self, out: Path) -> Worker:
        limit = int(self.config.memory_limit_gb * 2**30) if self.device == "cpu" else None
        return Worker(out, limit)

    def _measure_baselines(self, plan: _Plan, ref: WorkerOutcome) -> baseline_cache.Baselines:
        cfg = self.config
        eager = stats(ref.result["samples_ms"]) if ref.result.get("samples_ms") else None
        compile_stats = None
        if cfg.time and cfg.time_compile:
            comp = self._worker(plan.tmp / "compile").run(plan.job("compile", time=True),
                                                          cfg.process_timeout_s)
            if comp.ok:
                compile_stats = stats(comp.result["samples_ms"])
            else:
                raise JudgeError(f"torch.compile baseline failed: {comp.failure}")
        base = baseline_cache.Baselines(eager, compile_stats, ref.result.get("bandwidth_gbs"))
        if cfg.time and cfg.cache_baselines and eager is not None:
            baseline_cache.store(plan.baseline_key, base)
        return base


class _Plan:
    """The seeds, jobs and files of one judgement."""

    def __init__(self, cfg: JudgeConfig, task: Task, device: str, seed: int, tmp: Path):
        self.cfg, self.task, self.device, self.tmp = cfg, task, device, tmp
        self.trials = [[seed + i, 1.0] for i in range(cfg.trials)]
        self.trials += [[seed + 500 + j, s] for j, s in enumerate(cfg.scales)]
        self.timing_seeds = [seed + 1000 + k for k in range(2)]
        self.fresh_seed = seed + 2000
        self.init_seed = seed
        self.timing = {"warmup": cfg.warmup, "min_runs": cfg.min_runs,
                       "max_runs": cfg.max_runs, "budget_s": cfg.time_budget_s,
                       "target_rel_ci": cfg.target_rel_ci}
        self.baseline_key = baseline_cache.cache_key(
            task.sha256, device, task.precision.value, JUDGE_VERSION, self.timing,
            cfg.time_compile)

    def cached_baselines(self) -> baseline_cache.Baselines | None:
        if not self.cfg.cache_baselines:
            return None
        found = baseline_cache.load(self.baseline_key)
        if found and self.cfg.time_compile and found.compile is None:
            return None
        return found

    def job(self, role: str, time: bool | None = None, **extra: Any) -> dict[str, Any]:
        code = without_model(self.task.code) if role == "candidate" else self.task.code
        return {"role": role, "task_code": code, "device": self.device,
                "init_seed": self.init_seed, "trials": self.trials,
                "timing_seeds": self.timing_seeds, "fresh_seed": self.fresh_seed,
                "check": self.cfg.check,
                "time": self.cfg.time if time is None else time,
                "precision": self.task.precision.value, "float64": self.cfg.float64_check,
                "state_path": str(self.tmp / "state.pt"), "timing": self.timing, **extra}

    def _load(self, path: Path) -> Any:
        # compare on the device: large outputs compare far faster there than on the CPU
        try:
            return torch.load(path, weights_only=True, map_location=self.device)
        except Exception as exc:
            raise JudgeError(f"unreadable outputs {path.name}: {exc}") from None
        finally:
            path.unlink(missing_ok=True)

    def collect_reference(self) -> dict[str, Any]:
        folder = self.tmp / "reference"
        n = len(self.trials) if self.cfg.check else 0
        records = [self._load(folder / f"trial_{i}.pt") for i in range(n)]
        timed = [self._load(folder / f"timed_{k}.pt") for k in range(len(self.timing_seeds))
                 if self.cfg.check]
        shutil.rmtree(folder, ignore_errors=True)
        return {"out": [r["out"] for r in records],
                "out64": [r["out64"] for r in records] if all("out64" in r for r in records)
                and records else None, "timed": timed}

    def collect_candidate(self) -> list[list[Any]]:
        return [self._load(self.tmp / "cand" / f"outputs_{i}.pt")
                for i in range(len(self.trials))]

    def collect_timed(self) -> list[dict[str, Any]]:
        return [self._load(p) for p in sorted((self.tmp / "cand").glob("timed_*.pt"))]
