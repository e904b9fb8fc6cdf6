"""Judge a candidate against a task: check sources, build, verify, time, reward (judge-v15).

    cuda-agent judge ../shared/kernelbench/kernelbench.jsonl::1/19 my_workspace --json

The reference, the torch.compile baseline and the candidate each run in a fresh process
(started at once, so their start-up overlaps the build; with baselines cached the reference
runs, is collected and ended during the build, and the candidate's worker is staged then;
with ``candidate_processes`` > 1 more candidate workers time it again, ``judge.retime``).
The candidate's job has no reference ``Model``, and its process is
confined (``confine``: read-only file system, private /tmp, no network, own pid namespace).
Each worker packs its outputs into one buffer (device memory shared by CUDA IPC, device
memory this process lent the confined candidate, a sealed memory file, or a file) that this
process copies before the worker exits (a lent one: reads after); all comparison happens
here. See docs/judge.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import secrets
import tempfile
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from cuda_agent.build.builder import Builder
from cuda_agent.judge import confine
from cuda_agent.judge.baseline_runs import time_baselines
from cuda_agent.judge.candidate import Candidate, CandidateError
from cuda_agent.judge.config import JudgeConfig
from cuda_agent.judge.gpu_turn import GpuTurn
from cuda_agent.judge.plan import JudgeError, JudgePlan
from cuda_agent.judge.record import Verdict
from cuda_agent.judge.retime import Staging, Timed, stage_extra, time_again
from cuda_agent.judge.runner import Worker, WorkerOutcome, close_all
from cuda_agent.judge.shapes import combine
from cuda_agent.judge.static_check import check_source
from cuda_agent.judge.verify import check_outputs, check_run, check_timing
from cuda_agent.results import JudgeResult
from cuda_agent.tasks.shapes import input_shapes, shape_tasks
from cuda_agent.tasks.task import Task, TaskError


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise JudgeError("--device cuda asked for, but torch sees no CUDA device")
    return device


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
            self._confinement = confine.confinement(self.config.confine)
        except confine.ConfinementUnavailable as exc:
            raise JudgeError(str(exc)) from None
        self._spares: list[Worker] = []
        self._turn = GpuTurn(self.config.gpu_lock)
        self._finalizer = weakref.finalize(self, close_all, self._spares)

    def __enter__(self) -> Judge:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the spare workers."""
        close_all(self._spares)
        self._turn.close()

    def warm(self, timeout_s: float = 60.0) -> bool:
        """Start spare workers if there are none; wait until they wait for a job."""
        if not self._spares:
            self._spares.extend(self._set())
        deadline = time.monotonic() + timeout_s
        return all(w.wait_idle(max(0.0, deadline - time.monotonic())) for w in self._spares)

    def judge(self, task: Task, candidate: Candidate, profile: bool = False) -> JudgeResult:
        """The verdict; a task declaring ``INPUT_SHAPES`` is judged at every shape (or at
        ``config.shape`` alone) and the verdicts combined (``judge.shapes``)."""
        start = time.perf_counter()
        seed = self.config.seed if self.config.seed is not None else secrets.randbelow(2**30)
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
            result = self._judge_once(task, candidate, seed, profile)
        else:
            parts = []
            for name, shaped in variants:
                parts.append((name, self._judge_once(shaped, candidate, seed, profile)))
                if not parts[-1][1].compiled:
                    break  # a failed build fails at every shape
            result = combine(parts, len(variants))
        if self.config.keep_warm and not self._spares:
            self._spares.extend(self._set())
        return dataclasses.replace(result, seconds=time.perf_counter() - start)

    def _judge_once(self, task: Task, candidate: Candidate, seed: int, profile: bool
                    ) -> JudgeResult:
        with tempfile.TemporaryDirectory(prefix="cuda-agent-judge-") as tmp:
            return self._judge(task, candidate, Path(tmp), seed, profile)

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
        plan = JudgePlan(cfg, task, self.device, seed, tmp)
        with verdict.phase("workers"):
            if len(self._spares) == 1 + self._candidates():
                workers = self._spares[:]
            else:
                close_all(self._spares)
                workers = self._set()
            self._spares.clear()
            if self.config.keep_warm and self.device != "cpu":
                # the next set starts up while this judgement runs; on the CPU, where it
                # would compete with the build and the timed calls, when it ends (judge())
                self._spares.extend(self._set())
        verdict.isolation = confine.isolation(workers[1])
        try:
            return self._run(verdict, plan, snapshot, candidate.kind, workers, profile)
        finally:
            for worker in workers:
                worker.close()

    def _run(self, verdict: Verdict, plan: JudgePlan, snapshot: Path, kind: str,
             workers: list[Worker], profile: bool) -> JudgeResult:
        cfg, (ref_worker, *cand_workers) = self.config, workers
        cached = plan.cached_baselines() if cfg.time else None
        measure = cfg.time and cached is None
        # with nothing to time, the reference runs on the device while the kernels build, and
        # is collected there too (not when the GPU is shared: it runs in this judge's turn)
        early = not measure and cfg.gpu_lock is None
        with contextlib.ExitStack() as stack:
            ahead = None
            if early:
                ref_worker.start(plan.job("reference", time=False), hold=True)
            if self.device.startswith("cuda") and cfg.gpu_lock is None:
                for worker in cand_workers:
                    worker.prepare(self.device)  # its CUDA context, during the build
            if early:
                helper = stack.enter_context(ThreadPoolExecutor(1, "judge-reference"))
                ahead = helper.submit(self._ahead, verdict, plan, snapshot, kind, workers)
                stack.callback(_stop_unless_done, ahead, ref_worker)  # before the join
            if kind == "workspace":
                with verdict.phase("build"):
                    verdict.build = self.builder.build(snapshot)
                if not verdict.build.ok:
                    first = "; ".join(str(d) for d in verdict.build.errors[:3]) or "see log"
                    return verdict.fail(f"build failed: {first}")
            if cfg.gpu_lock is None:
                return self._run_on_gpu(verdict, plan, snapshot, kind, workers, profile,
                                        cached, ahead)
            with verdict.phase("gpu_wait"):
                for worker in workers:  # interpreter start-up is CPU work: not in the turn
                    worker.wait_idle(cfg.process_timeout_s)
                self._turn.acquire()
            held = time.perf_counter()
            try:
                result = self._run_on_gpu(verdict, plan, snapshot, kind, workers, profile,
                                          cached, ahead)
            finally:
                self._turn.release()
            held = time.perf_counter() - held  # the verdict's phases are final by now
            return dataclasses.replace(result, phases=(*result.phases, ("gpu_held", held)))

    def _ahead(self, verdict: Verdict, plan: JudgePlan, snapshot: Path, kind: str,
               workers: list[Worker]) -> tuple[WorkerOutcome, dict[str, Any], list[dict]]:
        """Beside the build: the reference run, collected and ended, then the candidate's
        workers staged, their device packs lent and mapped (``Worker.prepare``)."""
        ref, reference = self._reference(verdict, plan, workers[0], None)
        staged = self._stage(verdict, plan, snapshot, kind, workers[1:], reference)
        if self.device.startswith("cuda"):
            workers[1].prepare(self.device, staged[0], record=self.config.activity_record)
        return ref, reference, staged

    def _stage(self, verdict: Verdict, plan: JudgePlan, snapshot: Path, kind: str,
               workers: list[Worker], reference: dict[str, Any]) -> list[dict[str, Any]]:
        """The fields of each candidate worker's job (the extra ones' contexts made)."""
        with verdict.phase("stage_candidate"):
            first = confine.stage_candidate(workers[0], snapshot, plan.tmp / "state.pt",
                                            kind, self.device, plan.pack_bytes(reference))
            return [first, *stage_extra(self._staging(plan, snapshot, kind, reference),
                                        workers[1:])]

    def _staging(self, plan: JudgePlan, snapshot: Path, kind: str,
                 reference: dict[str, Any]) -> Staging:
        """How the extra candidate workers are staged (packs for timed outputs alone)."""
        return Staging(plan, snapshot, kind, self.device,
                       plan.pack_bytes(reference, with_trials=False))

    def _reference(self, verdict: Verdict, plan: JudgePlan, ref_worker: Worker,
                   job: dict[str, Any] | None) -> tuple[WorkerOutcome, dict[str, Any]]:
        """Wait for the reference (starting ``job`` first, if given), collect its outputs and
        end its process."""
        with verdict.phase("reference"):
            if job is not None:
                ref_worker.start(job, hold=True)
            ref = ref_worker.wait(self.config.process_timeout_s)
        verdict.worker_stages("reference", ref.result)
        if not ref.ok:
            raise JudgeError(f"reference failed for task {plan.task.name}: {ref.failure}\n"
                             f"{ref.stderr_tail[-800:]}")
        reduced = plan.keep(ref.result.get("kept"))
        if reduced:
            verdict.flags.append(reduced)
        with verdict.phase("collect_reference"):
            reference = plan.collect_reference(ref, ref_worker)
        ref_worker.close()
        return ref, reference

    def _run_on_gpu(self, verdict: Verdict, plan: JudgePlan, snapshot: Path, kind: str,
                    workers: list[Worker], profile: bool, cached: Any, ahead: Future | None
                    ) -> JudgeResult:
        cfg, task = self.config, plan.task
        ref_worker, cand_worker, *extra = workers
        if cfg.time and cached is None and cfg.gpu_lock is not None:
            cached = plan.cached_baselines()  # measured meanwhile by a judge in its turn
        measure = cfg.time and cached is None
        if ahead is not None:
            with verdict.phase("reference_join"):  # started before the build
                ref, reference, staged = ahead.result()
        else:
            ref, reference = self._reference(verdict, plan, ref_worker, plan.job(
                "reference", time=measure, bandwidth=measure, tracer=self._timer()))
        with verdict.phase("baselines"):
            base = cached or time_baselines(plan, ref, self._worker, self._timer())
        if ahead is None:
            staged = self._stage(verdict, plan, snapshot, kind, workers[1:], reference)
        extension = verdict.build.extension_path if verdict.build else None
        tracer = None if extension else self.builder.build_tracer()
        job = plan.job("candidate", extension=extension, tracer=tracer,
                       timing=plan.candidate_timing())
        with verdict.phase("candidate"):
            cand = cand_worker.run({**job, "profile": profile, **staged[0]},
                                   cfg.process_timeout_s, hold=True)
        verdict.worker_stages("candidate", cand.result)
        verdict.compiled = cand.ok or cand.result.get("stage") not in (None, "start", "load")
        if not cand.ok:
            leftover = cand_worker.close()
            if leftover:
                verdict.reasons.append(f"candidate left {leftover} process(es) running "
                                       "(killed)")
            return verdict.fail(f"candidate failed: {cand.failure}")
        verdict.profile = cand.result.get("profile", "")
        confine.keep_inline_cache(cand_worker, snapshot, kind)
        with verdict.phase("collect_candidate"):
            got, unreadable, leftover = plan.collect_and_close(cand, cand_worker,
                                                               staged[0]["pack"])
        if unreadable:
            verdict.reasons.append(f"candidate outputs unreadable: {unreadable}")
        if leftover:
            verdict.reasons.append(f"candidate left {leftover} process(es) running (killed)")
        if got is None:
            return verdict.fail()
        outputs, timed = got
        if cfg.check:
            with verdict.phase("compare"):
                passed = check_outputs(verdict, reference, outputs, task.precision.value, cfg)
            if not passed:
                return verdict.finish(cfg.faster_margin)
        verdict.correct = cfg.check and not leftover
        if cfg.time and verdict.correct:
            with verdict.phase("compare_timed"):  # first: a bad run stops the extra ones
                first = check_run(verdict, Timed(cand, timed), base, reference, cfg)
            del got, outputs, timed  # views of the first process's pack: not held any longer
            if not first:
                return verdict.finish(cfg.faster_margin)
            again = time_again(verdict, self._staging(plan, snapshot, kind, reference), extra,
                               staged[1:], job,
                               lambda run: check_run(verdict, run, base, reference, cfg))
            if again is None:
                return verdict.fail()
            with verdict.phase("compare_timed"):
                check_timing(verdict, [Timed(cand, []), *again], base, reference, cfg)
        return verdict.finish(cfg.faster_margin)

    def _timer(self) -> str | None:
        """The fixed layer linked alone: on CUDA it carries the timing blocker."""
        return self.builder.build_tracer() if self.device.startswith("cuda") else None

    def _worker(self, candidate: bool = False) -> Worker:
        """A baseline worker, or the candidate's: confined, and preloading what its
        dispatch-mode trace imports (seconds of CPU the baselines need not spend)."""
        limit = int(self.config.memory_limit_gb * 2**30) if self.device == "cpu" else None
        return Worker(limit, confine=self._confinement if candidate else None, trace=candidate)

    def _set(self) -> list[Worker]:
        """A reference worker and ``_candidates()`` (confined) candidate workers."""
        return [self._worker(), *(self._worker(candidate=True)
                                  for _ in range(self._candidates()))]

    def _candidates(self) -> int:
        """Candidate processes a judgement uses: the extra ones only time."""
        return self.config.candidate_processes_for(self.device)


def _stop_unless_done(ahead: Future, worker: Worker) -> None:
    """Leaving early (a failed build): kill a reference still running, so its helper's
    wait ends now rather than when the reference finishes."""
    if not ahead.done():
        worker.kill()
