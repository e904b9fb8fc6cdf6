"""The candidate timed again in more fresh processes (``JudgeConfig.candidate_processes``).

A time measured in one process carries that process's offset (on an H100 a 50-90 us
kernel's median moves by 0.15-0.35% from one process to the next, while each process's own
interval is 0.2%). Each extra process is staged like the first (confined, its pack lent),
runs the timing part of the candidate's job alone, and sends back its timed outputs, which
the judge re-checks as it does the first process's (``verify.check_timing``).
"""

from __future__ import annotations

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


def stage_extra(plan: JudgePlan, snapshot: Path, kind: str, workers: list[Worker],
                device: str, reference: dict[str, Any]) -> list[dict[str, Any]]:
    """Stage each extra worker (its pack sized for the timed outputs alone) and, on CUDA,
    make its context and map its pack now."""
    size = plan.pack_bytes(reference, with_trials=False)
    fields = []
    for worker in workers:
        staged = confine.stage_candidate(worker, snapshot, plan.tmp / "state.pt", kind,
                                         device, size)
        if device.startswith("cuda"):
            worker.prepare(device, staged)
        fields.append(staged)
    return fields


def time_again(verdict: Verdict, plan: JudgePlan, workers: list[Worker],
               staged: list[dict[str, Any]], job: dict[str, Any], snapshot: Path, kind: str
               ) -> list[Timed] | None:
    """Run ``job`` (the candidate's, without its trials) in each extra worker, one after
    another (a file candidate's with what the first process compiled); their timings, or
    None after adding the reason a process failed."""
    runs = []
    for k, (worker, fields) in enumerate(zip(workers, staged, strict=True), start=2):
        role = f"candidate{k}"
        confine.lend_inline_cache(worker, snapshot, kind)
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
        runs.append(Timed(done, got[1]))
    return runs
