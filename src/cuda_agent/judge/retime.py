"""The candidate timed again in more fresh processes (``JudgeConfig.candidate_processes``).

A time measured in one process carries that process's offset (on an H100 a 50-90 us
kernel's median moves by 0.15-0.35% from one process to the next, while each process's own
interval is 0.2%). Each extra process is staged like the first (confined, its pack lent),
runs the timing part of the candidate's job alone (its cross-check with the judge's clock
included), and sends back its timed outputs, which the judge re-checks as it does the first
process's (``verify.check_run``) as soon as they arrive.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cuda_agent.judge import confine
from cuda_agent.judge.plan import JudgePlan
from cuda_agent.judge.record import Verdict
from cuda_agent.judge.runner import Worker, WorkerOutcome


@dataclass(frozen=True)
class Timed:
    """One process's timing of the candidate: its outcome and its timed outputs."""

    outcome: WorkerOutcome
    outputs: list[dict[str, Any]]


EXTRA_WARMUP_S = 0.05
EXTRA_WARMUP_CALLS = 10
"""An extra process's warm-up with ``split_timing``: at least this many calls and 0.05 s
(the first process's: 0.2 s). The GPU has just run the process before it, so its clocks
are up; the calls cover the process's own first call (module loading, the allocator's
first blocks), which no trial has made there, and keep its host time out of the median
that sets the gate's wait."""
LAZY_PACK_BYTES = 256 << 20
"""Extra processes whose timed outputs take more than this are staged one at a time, each
just before it runs, and their outputs checked and dropped at once: otherwise every extra
process's pack would be held together (gigabytes each for KernelBench's largest problems)."""


@dataclass(frozen=True)
class Staging:
    """What staging an extra worker needs: its pack's size is the timed outputs' alone."""

    plan: JudgePlan
    snapshot: Path
    kind: str
    device: str
    size: int | None

    @property
    def lazy(self) -> bool:
        return self.size is not None and self.size > LAZY_PACK_BYTES

    def stage(self, worker: Worker) -> dict[str, Any]:
        """Stage ``worker`` and, on CUDA, make its context and map its pack now."""
        staged = confine.stage_candidate(worker, self.snapshot, self.plan.tmp / "state.pt",
                                         self.kind, self.device, self.size)
        if self.device.startswith("cuda"):
            worker.prepare(self.device, staged, record=self.plan.cfg.activity_record)
        return staged


def stage_extra(staging: Staging, workers: list[Worker]) -> list[dict[str, Any] | None]:
    """Stage each extra worker now (None for each where ``staging.lazy``: staged in turn)."""
    return [None if staging.lazy else staging.stage(worker) for worker in workers]


def time_again(verdict: Verdict, staging: Staging, workers: list[Worker],
               staged: list[dict[str, Any] | None], job: dict[str, Any],
               check: Callable[[Timed], bool]) -> list[Timed] | None:
    """Run ``job`` (the candidate's, without its trials) in each extra worker, one after
    another (a file candidate's with what the first process compiled), each run's timed
    outputs passed to ``check`` and dropped; their timings, or None after adding the reason
    a process failed."""
    plan, runs = staging.plan, []
    if plan.cfg.split_timing:  # the GPU is warm from the process before
        warmup = max(int(job["timing"]["warmup"]), EXTRA_WARMUP_CALLS)
        job = {**job, "timing": {**job["timing"], "warmup": warmup,
                                 "warmup_s": EXTRA_WARMUP_S}}
    for k, (worker, fields) in enumerate(zip(workers, staged, strict=True), start=2):
        role = f"candidate{k}"
        if fields is None:
            with verdict.phase(f"stage_{role}"):
                fields = staging.stage(worker)
        confine.lend_inline_cache(worker, staging.snapshot, staging.kind)
        with verdict.phase(role):
            done = worker.run({**job, **fields, "check": False}, plan.cfg.process_timeout_s,
                              hold=True)
        verdict.worker_stages(role, done.result)
        if not done.ok:
            leftover = worker.close()
            verdict.reasons.append(f"candidate failed in timing process {k}: {done.failure}"
                                   + (f"; it left {leftover} process(es) running (killed)"
                                      if leftover else ""))
            return None
        with verdict.phase(f"collect_{role}"):  # its outputs read, then it is ended
            got, unreadable, leftover = plan.collect_and_close(done, worker, fields["pack"],
                                                               with_trials=False)
        if unreadable:
            verdict.reasons.append(f"candidate outputs unreadable (timing process {k}): "
                                   f"{unreadable}")
            return None
        if leftover:
            verdict.reasons.append(f"candidate left {leftover} process(es) running in timing "
                                   f"process {k} (killed)")
            return None
        passed = check(Timed(done, got[1]))
        del got  # views of this process's pack: dropped before the next one is staged
        if not passed:
            return None
        runs.append(Timed(done, []))
    return runs
