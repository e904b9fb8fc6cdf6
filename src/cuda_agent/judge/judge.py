"""Judge a candidate against a task: its steps, in order (docs/judge.md).

    cuda-agent judge ../shared/kernelbench/kernelbench.jsonl::1/19 my_workspace --json

1. snapshot: copy what may be read of the candidate; 2. static check of ``model_new.py``;
3. build (workspaces; the reference's first job runs meanwhile); 4. the reference: weights
and the sizes of a call, which plan the kept calls; 5. baselines, cached (held to a fresh
check of the reference, ``recheck``) or measured in processes of their own; 6. the
candidate, in fresh confined processes, every call handed out and timed by the judge
(``driver``), some kept at random; 7. the reference's answers for
exactly the calls kept; 8. compare them, and the kept inputs; 9. time: the candidate's,
bounded by the judge's clock; 10. reward.

What only serves latency sits beside these steps (``schedule``): spare workers started
ahead, the reference's first job run during the build, the candidate's workers staged then.
Where judges share a GPU (``gpu_lock``), each step holds the GPU's turn as its GPU work
needs (``gpu_turn``): exclusive for what is timed, shared for the rest.
"""

from __future__ import annotations

import contextlib
import dataclasses
import secrets
import shutil
import time
import weakref
from pathlib import Path
from typing import Any

import torch

from cuda_agent import leftovers
from cuda_agent.build.builder import Builder
from cuda_agent.judge import confine
from cuda_agent.judge.baseline_runs import time_baselines
from cuda_agent.judge.candidate import Candidate, CandidateError
from cuda_agent.judge.config import JudgeConfig
from cuda_agent.judge.cpu_size import judged_task, marked, reference_note
from cuda_agent.judge.gpu_turn import SHARED, GpuTurn
from cuda_agent.judge.memory import worker_limit
from cuda_agent.judge.plan import JudgeError, JudgePlan
from cuda_agent.judge.recheck import checked, source
from cuda_agent.judge.record import Verdict
from cuda_agent.judge.retime import Staging, run_candidate, time_again
from cuda_agent.judge.runner import WORKER_DIR, Worker, close_all
from cuda_agent.judge.schedule import Ahead
from cuda_agent.judge.shapes import combine
from cuda_agent.judge.static_check import check_source
from cuda_agent.judge.verify import check_kept, check_run, check_timing, runs_settled
from cuda_agent.results import JudgeResult
from cuda_agent.tasks.shapes import input_shapes, shape_tasks
from cuda_agent.tasks.task import Task, TaskError


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise JudgeError("--device cuda asked for, but torch sees no CUDA device")
    return device


JUDGE_DIR = "cuda-agent-judge-"
"""Prefix of a judgement's own folder (the candidate's snapshot, the plan's files)."""

class Judge:
    """Stateless apart from its config and its spare workers; judges many candidates.

    With ``keep_warm`` the judge starts the next judgement's worker processes while one
    runs (on the CPU: when it ends), so they import torch while the agent thinks;
    ``close()`` stops them.
    """

    def __init__(self, config: JudgeConfig | None = None):
        self.config = config or JudgeConfig()
        self.device = resolve_device(self.config.device)
        self.builder = Builder(self.config.build.model_copy(update={"device": self.device}))
        try:
            self._confinement = confine.confinement(self.config.confine,
                                                     self.config.build.resolved_cache())
        except confine.ConfinementUnavailable as exc:
            raise JudgeError(str(exc)) from None
        self._spares: list[list[Worker]] = []
        """Started worker sets (``_set``), oldest first: the next judgement takes the first."""
        self._baselines: dict[str, Any] = {}
        """Baselines this judge measured and may not store (``store_baselines`` off)."""
        self._turn = GpuTurn(self.config.gpu_lock)
        leftovers.sweep((JUDGE_DIR, WORKER_DIR))  # left by judges killed outright
        self._finalizer = weakref.finalize(self, _close_sets, self._spares)

    def __enter__(self) -> Judge:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the spare workers."""
        _close_sets(self._spares)
        self._turn.close()

    def warm(self, timeout_s: float = 60.0) -> bool:
        """Start spare worker sets up to ``warm_sets`` (one at least); wait until they wait
        for a job."""
        self._refill(self.config.warm_sets if self.config.keep_warm else 1)
        deadline = time.monotonic() + timeout_s
        return all(w.wait_idle(max(0.0, deadline - time.monotonic()))
                   for workers in self._spares for w in workers)

    def take_spares(self, other: Judge) -> None:
        """Take ``other``'s spare sets when they are the sets this judge would start (a
        verify and a profile call of an episode share them), up to ``warm_sets``."""
        if other is self or not other._spares or other._shape() != self._shape():
            return
        while other._spares and len(self._spares) < self.config.warm_sets:
            self._spares.append(other._spares.pop(0))

    def _refill(self, count: int) -> None:
        while len(self._spares) < count:
            self._spares.append(self._set())

    def _shape(self) -> tuple:
        cfg = self.config
        return (self.device, self._candidates(), cfg.memory_limit_gb, cfg.confine)

    def judge(self, task: Task, candidate: Candidate, profile: bool = False) -> JudgeResult:
        """The verdict; a task declaring ``INPUT_SHAPES`` is judged at every shape (or at
        ``config.shape`` alone) and the verdicts combined (``judge.shapes``)."""
        start = time.perf_counter()
        seed = self.config.seed if self.config.seed is not None else secrets.randbits(128)
        try:
            variants = shape_tasks(task)
        except TaskError as exc:
            raise JudgeError(str(exc)) from None
        if self.config.shape is not None:
            variants = [v for v in variants if v[0] == self.config.shape]
            if not variants:
                raise JudgeError(f"--shape {self.config.shape!r}: the task declares no such "
                                 f"input shape (shapes: {', '.join(input_shapes(task.code))})")
        if not variants:
            result = self._judge_sized(task, candidate, seed, profile)
        else:
            parts = []
            for name, shaped in variants:
                parts.append((name, self._judge_sized(shaped, candidate, seed, profile)))
                if not parts[-1][1].compiled:
                    break  # a failed build fails at every shape
            result = combine(parts, len(variants))
        if self.config.keep_warm:
            self._refill(self.config.warm_sets)
        return dataclasses.replace(result, seconds=time.perf_counter() - start)

    def _judge_sized(self, task: Task, candidate: Candidate, seed: int, profile: bool
                     ) -> JudgeResult:
        """The verdict at the size ``task`` is judged at on this device (``cpu_size``)."""
        sized, sizing = judged_task(task, self.config, self.device)
        try:
            result = self._judge_once(sized, candidate, seed, profile)
        except JudgeError as exc:
            note = reference_note(sizing)
            if not note:
                raise
            raise JudgeError(f"{exc}{note}") from None
        return marked(result, sizing, self.config)

    def _judge_once(self, task: Task, candidate: Candidate, seed: int, profile: bool
                    ) -> JudgeResult:
        with _owned(JUDGE_DIR) as tmp:
            verdict = Verdict(task, self.device, seed)
            try:
                snapshot = candidate.snapshot(Path(tmp) / "candidate")  # 1
            except CandidateError as exc:
                return verdict.fail(f"candidate rejected: {exc}")
            problems = check_source((snapshot / "model_new.py").read_text())  # 2
            if problems:
                return verdict.fail(*(f"static check: {p}" for p in problems))
            plan = JudgePlan(self.config, task, self.device, seed, Path(tmp))
            workers = self._take_workers(verdict)
            try:
                return self._steps(verdict, plan, snapshot, candidate.kind, workers, profile)
            finally:
                with self._turn.hold(SHARED):  # a worker's exit (its CUDA context's) too
                    close_all(workers)

    def _steps(self, verdict: Verdict, plan: JudgePlan, snapshot: Path, kind: str,
               workers: list[Worker], profile: bool) -> JudgeResult:
        """Steps 3-10. Where the GPU is shared (``gpu_lock``) each step holds its turn as its
        GPU work needs (``gpu_turn``): timed phases exclusive, the rest shared, the build and
        the workers' start-up not at all."""
        cfg = self.config
        staging = Staging(plan, snapshot, kind, self.device, self._turn)
        cached = self._cached(plan) if cfg.time else None
        before = self._turn.totals()
        with Ahead(self, verdict, plan, staging, workers, cached) as ahead:  # 3, 4 beside
            if kind == "workspace":
                with verdict.phase("build"):
                    verdict.build = self.builder.build(snapshot)
                if not verdict.build.ok:
                    first = "; ".join(str(d) for d in verdict.build.errors[:3]) or "see log"
                    return verdict.fail(f"build failed: {first}")
            result = self._on_gpu(verdict, plan, staging, workers, ahead, cached, profile)
        return self._turn_phases(result, before)

    def _on_gpu(self, verdict: Verdict, plan: JudgePlan, staging: Staging,
                workers: list[Worker], ahead: Ahead, cached: Any, profile: bool
                ) -> JudgeResult:
        """Steps 4-10, each in order."""
        cfg, (ref_worker, *cand_workers) = self.config, workers
        ref, staged, base = self._reference_and_baselines(verdict, plan, ahead, cached)  # 4, 5
        if cfg.time and not cfg.store_baselines and verdict.baselines and \
                verdict.baselines[-1].source in ("measured", "remeasured"):
            # kept as measured: a check's faster time (recheck.confirmed) serves this
            # judgement only, else each call's check would ratchet the figure down
            self._baselines[plan.baseline_key] = base
        job = plan.job("candidate", timing=plan.candidate_timing(), profile=profile,
                       extension=verdict.build.extension_path if verdict.build else None,
                       tracer=None if verdict.build else self.builder.build_tracer())
        done, first = run_candidate(verdict, staging, cand_workers[0], {**job, **staged[0]}, 1,
                                    keep=lambda w: confine.keep_inline_cache(
                                        w, staging.snapshot, staging.kind))
        verdict.compiled = done.ok or done.result.get("stage") not in (
            None, "start", "calibrate", "load")  # 6
        if first is None:
            return self._failed(verdict, done, cand_workers[0])
        verdict.profile = done.result.get("profile", "")
        runs = [first]
        if cfg.time:
            if not check_run(verdict, first, base):
                return verdict.finish(cfg.faster_margin)
            again = time_again(verdict, staging, cand_workers[1:], staged[1:], job,
                               enough=lambda more: runs_settled([first, *more], base, cfg))
            if again is None:
                return verdict.fail()
            runs += again
        if cfg.check:
            kept = plan.checked_order([s for run in runs for s in run.kept])
            with self._turn.hold(SHARED):
                with verdict.phase("reference_kept"):  # 7
                    answers = ahead.answers(ref_worker, kept)
                with verdict.phase("compare"):  # 8
                    if not check_kept(verdict, answers, kept, plan.key,
                                      plan.task.precision.value, cfg):
                        return verdict.finish(cfg.faster_margin)
        verdict.correct = cfg.check
        if cfg.time and verdict.correct:
            if not all(check_run(verdict, run, base) for run in runs[1:]):
                return verdict.finish(cfg.faster_margin)
            check_timing(verdict, runs, base, ref.result.get("io_bytes"), cfg)  # 9
        return verdict.finish(cfg.faster_margin)  # 10

    def _reference_and_baselines(self, verdict: Verdict, plan: JudgePlan, ahead: Ahead,
                                 cached: Any) -> tuple[Any, list[dict[str, Any]], Any]:
        """Steps 4 and 5: the reference's first outcome, the candidate workers' staged job
        fields and the baselines, cached or measured. Judges sharing a GPU measure a new
        task's baselines one at a time (``GpuTurn.first_to_measure``); one that waited
        looks for them again first (the judge before it measured them)."""
        measuring = self._turn.first_to_measure() if ahead.measure else contextlib.nullcontext()
        with measuring:
            if ahead.measure and (found := self._cached(plan)) is not None:
                cached, ahead.measure = found, False
            (ref, ref_clock), staged = ahead.join()
            with verdict.phase("baselines"):
                if cached is not None:  # held to a fresh check of the held reference
                    base = checked(verdict, plan, ahead.workers[0], cached,
                                   self._origin(plan, cached), self._worker, self._timer(),
                                   self._turn)
                else:
                    base = time_baselines(plan, ref, ref_clock, self._worker, self._timer(),
                                          self._turn)
                    if base.eager is not None:
                        verdict.baselines.append(source("measured", base))
        return ref, staged, base

    def _turn_phases(self, result: JudgeResult, before: tuple[float, float, float]
                     ) -> JudgeResult:
        """The verdict's phases with the judgement's GPU turn: ``gpu_wait`` (waiting for it),
        ``gpu_held`` (holding it, shared or exclusive) and ``gpu_exclusive``."""
        if self._turn.path is None:
            return result
        waited, shared, exclusive = (now - then for now, then
                                     in zip(self._turn.totals(), before, strict=True))
        return dataclasses.replace(result, phases=(
            *result.phases, ("gpu_wait", round(waited, 4)),
            ("gpu_held", round(shared + exclusive, 4)), ("gpu_exclusive", round(exclusive, 4))))

    def _cached(self, plan: JudgePlan) -> Any:
        """Baselines this judge measured itself and kept (store_baselines off), else the
        shared cache's: the judge's own are the later figure, taken under its conditions."""
        if not self.config.cache_baselines:
            return None
        return self._baselines.get(plan.baseline_key) or plan.cached_baselines()

    def _origin(self, plan: JudgePlan, found: Any) -> str:
        """Where ``_cached`` found ``found``: this judge's memory, or the shared cache."""
        return "judge" if self._baselines.get(plan.baseline_key) is found else "cached"

    def _failed(self, verdict: Verdict, done, worker: Worker) -> JudgeResult:
        if not done.ok:
            leftover = worker.close()
            if leftover:
                verdict.reasons.append(f"candidate left {leftover} process(es) running "
                                       "(killed)")
            return verdict.fail(f"candidate failed: {done.failure}")
        return verdict.fail()

    def _take_workers(self, verdict: Verdict) -> list[Worker]:
        with verdict.phase("workers"):
            workers = self._spares.pop(0) if self._spares else []
            if len(workers) != 1 + self._candidates():
                close_all(workers)
                workers = self._set()
            if self.config.keep_warm and self.device != "cpu":
                # the next sets start up while this judgement runs; on the CPU, where they
                # would compete with the build and the timed calls, when it ends (judge())
                self._refill(self.config.warm_sets)
        verdict.isolation = confine.isolation(workers[1])
        return workers

    def _timer(self) -> str | None:
        """The fixed layer linked alone: on CUDA it carries the timing blocker."""
        return self.builder.build_tracer() if self.device.startswith("cuda") else None

    def _worker(self, candidate: bool = False) -> Worker:
        """A baseline worker, or the candidate's: confined, and preloading what its
        dispatch-mode trace imports (seconds of CPU the baselines need not spend). Every
        worker's OpenMP threads sleep as soon as a parallel region ends
        (``OMP_WAIT_POLICY=PASSIVE``): a thread still spinning after a call would count as
        the candidate's work after it, and eager and candidate are timed alike. On the CPU
        every timing worker takes its memory from the heap, never fresh from the system
        (``MALLOC_MMAP_MAX_=0``), so memory a call frees and the judge poisoned is what the
        next allocation gets back, for candidate and baselines alike."""
        cpu = self.device == "cpu"
        limit = worker_limit(self.config, self.device)
        env = {"OMP_WAIT_POLICY": "PASSIVE"}
        if cpu:
            env.update(MALLOC_MMAP_MAX_="0", MALLOC_TRIM_THRESHOLD_=str(2**62))
        return Worker(limit, confine=self._confinement if candidate else None, env=env,
                      trace=candidate, candidate=candidate)

    def _set(self) -> list[Worker]:
        """A reference worker and ``_candidates()`` (confined) candidate workers."""
        return [self._worker(), *(self._worker(candidate=True)
                                  for _ in range(self._candidates()))]

    def _candidates(self) -> int:
        """Candidate processes a judgement uses: the extra ones only time."""
        return self.config.candidate_processes_for(self.device)


def _close_sets(sets: list[list[Worker]]) -> None:
    while sets:
        close_all(sets.pop())


__all__ = ["Judge", "JudgeError", "resolve_device"]


@contextlib.contextmanager
def _owned(prefix: str):
    """A folder named by this process (``leftovers``), removed on every way out."""
    folder = leftovers.owned_dir(prefix)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
