"""What a judgement does only to save time, beside its steps (``judge.Judge._steps``).

With nothing to time for the baselines (they are cached), the reference's first job
(weights, the sizes of a call) runs while the kernels build, on a helper thread that then
stages the candidate's workers: their folders, their lent packs and, on CUDA, their
contexts. Otherwise the same happens after the build. Where the GPU is shared
(``gpu_lock``) the helper first waits for the workers to start (CPU work), then holds the
GPU's turn shared for the reference and the staging (``gpu_turn``; exclusive for the
reference's timed calls when it times eager). Either way the reference stays, held, until
the candidate has run, and then answers for the calls the judge kept (``answers``).
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from cuda_agent.judge.clock import ClockError, judge_clock
from cuda_agent.judge.driver import Snapshot
from cuda_agent.judge.gpu_turn import SHARED, GpuTurn
from cuda_agent.judge.memory import reference_error, worker_limit
from cuda_agent.judge.plan import JudgeError, JudgePlan, Reference
from cuda_agent.judge.record import Verdict
from cuda_agent.judge.retime import Staging
from cuda_agent.judge.runner import Worker, WorkerOutcome
from cuda_agent.judge.turn_phases import trusted_job


def reference_first(verdict: Verdict, plan: JudgePlan, worker: Worker, measure: bool,
                    tracer: str | None, processes: int, turn: GpuTurn) -> WorkerOutcome:
    """The reference's first job, its worker then held: weights, a call's sizes (which plan
    the kept calls, ``JudgePlan.learn``) and, with ``measure``, eager's time (its calls
    driven by the judge) and the memory bandwidth; within the judge's GPU ``turn``."""
    job = plan.job("reference", time=measure, bandwidth=measure, tracer=tracer,
                   shared_gpu=measure and turn.path is not None)
    hold = trusted_job(turn) if measure else turn.hold(SHARED)
    with verdict.phase("reference"), hold as turns:
        if measure:
            worker.drive(plan.baseline_driver(), turns=turns)
        worker.start(job, hold=True)
        ref = worker.wait(plan.cfg.process_timeout_s)
    verdict.worker_stages("reference", ref.result)
    if not ref.ok:
        raise JudgeError(reference_error(plan.task.name, ref,
                                         worker_limit(plan.cfg, plan.device)))
    note = plan.learn(ref.result, processes)
    if note:
        verdict.flags.append(note)
    if ref.result.get("degenerate"):
        verdict.flags.append(str(ref.result["degenerate"]))
    return ref


class Ahead:
    """The reference's first job and the candidate workers' staging: run on a helper
    thread during the build where they can be (``early``), else at ``join``."""

    def __init__(self, judge: Any, verdict: Verdict, plan: JudgePlan, staging: Staging,
                 workers: list[Worker], cached: Any):
        self.judge, self.verdict, self.plan, self.staging = judge, verdict, plan, staging
        self.workers = workers
        self.measure = plan.cfg.time and cached is None
        self.early = not self.measure
        self._helper: ThreadPoolExecutor | None = None
        self._future: Future | None = None

    def __enter__(self) -> Ahead:
        cuda = self.plan.device.startswith("cuda")
        if cuda and self.plan.cfg.gpu_lock is None:
            for worker in self.workers[1:]:
                worker.prepare(self.plan.device)  # its CUDA context, during the build
        if self.early:
            self._helper = ThreadPoolExecutor(1, "judge-reference")
            self._future = self._helper.submit(self._run)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._future is not None and not self._future.done():
            for worker in self.workers:  # a failed build: the helper's waits end now
                worker.kill()
        if self._helper is not None:
            self._helper.shutdown(wait=True)

    def join(self) -> tuple[Any, list[dict[str, Any]]]:
        """The reference's first outcome (with its timing, when it timed eager) and each
        candidate worker's staged job fields."""
        if self._future is not None:
            with self.verdict.phase("reference_join"):
                return self._future.result()
        return self._run()

    def _run(self) -> tuple[Any, list[dict[str, Any]]]:
        ref_worker, *cand = self.workers
        turn = self.staging.turn
        if turn.path is not None:
            with self.verdict.phase("workers_start"):  # CPU work: not in the turn
                for worker in self.workers:
                    worker.wait_idle(self.plan.cfg.process_timeout_s)
        tracer = self.judge._timer() if self.measure else None
        ref = reference_first(self.verdict, self.plan, ref_worker, self.measure, tracer,
                              len(cand), turn)
        timed = None
        if self.measure and ref_worker.driver is not None:
            try:
                timed = judge_clock(ref_worker.driver.records)
            except ClockError as exc:
                raise JudgeError(f"reference's calls could not be timed: {exc}") from None
        with self.verdict.phase("stage_candidate"), turn.hold(SHARED):
            staged = [self.staging.stage(w) if k == 0 or not self.staging.lazy else None
                      for k, w in enumerate(cand)]
            self.staging.settle([w for w, fields in zip(cand, staged, strict=True) if fields])
        return (ref, timed), staged

    def answers(self, worker: Worker, kept: list[Snapshot]) -> Reference:
        """The reference's answers for ``kept`` (the held reference's further job)."""
        wide = self.plan.kept.wide if self.plan.kept is not None else 0
        done = worker.followup(self.plan.kept_job(kept, wide), self.plan.cfg.process_timeout_s)
        if not done.ok:
            raise JudgeError(reference_error(self.plan.task.name, done,
                                             worker_limit(self.plan.cfg, self.plan.device),
                                             " on the kept calls"))
        return self.plan.collect_reference(done, worker, [s.scale for s in kept])
