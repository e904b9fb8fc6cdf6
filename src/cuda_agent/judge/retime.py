"""The candidate timed again in more fresh processes (``JudgeConfig.candidate_processes``).

A time measured in one process carries that process's offset (on an H100 a 50-90 us
kernel's median moves by 0.15-0.35% from one process to the next, while each process's own
interval is 0.2%). Each extra process is staged like the first (confined, its pack lent),
and the judge drives its calls the same way (``driver``), keeping a few of them for the
reference to check; it runs with a shorter warm-up when ``split_timing`` is on.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cuda_agent.build import mapped, symbols
from cuda_agent.build.link import FIXED_PREFIX
from cuda_agent.judge import confine
from cuda_agent.judge.clock import ClockError, JudgeClock, judge_clock
from cuda_agent.judge.code_hold import CodeWatch
from cuda_agent.judge.driver import COUNTED, CallDriver, Snapshot
from cuda_agent.judge.gpu_turn import SHARED, GpuTurn
from cuda_agent.judge.guard import ALLOWED
from cuda_agent.judge.plan import EXTRA_WARMUP_CALLS, EXTRA_WARMUP_S, JudgePlan, kept_reader
from cuda_agent.judge.record import Verdict
from cuda_agent.judge.runner import Worker, WorkerOutcome
from cuda_agent.judge.turn_phases import candidate_job


@dataclass(frozen=True)
class Timed:
    """One process's timing of the candidate: its outcome, the judge's clock of its calls
    and the calls the judge kept from it."""

    outcome: WorkerOutcome
    clock: JudgeClock
    kept: list[Snapshot]


LAZY_PACK_BYTES = 256 << 20
"""Extra processes whose lent pack (one kept call's outputs and inputs) takes more than this
are staged one at a time, each just before it runs: otherwise every extra process's pack
would be held together (gigabytes each for KernelBench's largest problems)."""


@dataclass(frozen=True)
class Staging:
    """What staging and running a candidate worker needs: its pack holds one kept call;
    its GPU work is done within the judge's ``turn``."""

    plan: JudgePlan
    snapshot: Path
    kind: str
    device: str
    turn: GpuTurn

    @property
    def lazy(self) -> bool:
        size = self.plan.pack_bytes()
        return size is not None and size > LAZY_PACK_BYTES

    def stage(self, worker: Worker) -> dict[str, Any]:
        """Stage ``worker`` and, on CUDA, have it make its context and map its pack now."""
        staged = confine.stage_candidate(worker, self.snapshot, self.plan.tmp / "state.pt",
                                         self.kind, self.device, self.plan.pack_bytes())
        if self.device.startswith("cuda"):
            worker.prepare(self.device, staged, record=self.plan.cfg.activity_record)
        return staged

    def settle(self, workers: list[Worker]) -> None:
        """Where the GPU is shared, wait until ``workers`` have done what ``stage`` asked
        (GPU work: it must end inside the hold it began in)."""
        if self.turn.path is not None and self.device.startswith("cuda"):
            for worker in workers:
                worker.wait_prepared(self.plan.cfg.process_timeout_s)


def run_candidate(verdict: Verdict, staging: Staging, worker: Worker, job: dict[str, Any],
                  process: int, keep: Callable[[Worker], None] | None = None
                  ) -> tuple[WorkerOutcome, Timed | None]:
    """Run one candidate process under the judge's calls (``process``: 1 the first); its
    outcome, and its timing and kept calls once it has ended (None if it failed). ``keep``
    takes what the worker leaves (a single-file candidate's build) before it is closed.
    The process starts, runs and ends within the judge's GPU turn, exclusive where its
    calls are measured (``turn_phases.candidate_job``): it may use the GPU until it is dead."""
    plan = staging.plan
    role = "candidate" if process == 1 else f"candidate{process}"
    calls = plan.driver_plan(process)
    with candidate_job(staging.turn, calls.timed) as turns:
        try:
            watch = code_watch(worker)
            driver = worker.drive(calls, kept_reader(worker, plan.device, plan.pack_bytes()),
                                  at_counted=watch, turns=turns)
            with verdict.phase(role):
                done = worker.run(job, plan.cfg.process_timeout_s, hold=True)
            verdict.worker_stages(role, done.result)
            return done, _collect(verdict, plan, worker, process, (done, driver, watch), keep)
        finally:
            worker.close()  # dead before the turn goes


def _collect(verdict: Verdict, plan: JudgePlan, worker: Worker, process: int,
             ran: tuple[WorkerOutcome, CallDriver, CodeWatch],
             keep: Callable[[Worker], None] | None) -> Timed | None:
    """A candidate process's run, once it has reported: its loaded code checked, what it
    left counted and killed, its timing; None (the reason added) if it failed."""
    done, driver, watch = ran
    role = "candidate" if process == 1 else f"candidate{process}"
    where = "" if process == 1 else f" (timing process {process})"
    if not done.ok:
        watch.close()
        driver.join(5.0)
        if driver.error:  # what the judge saw of it may say more than its own report
            verdict.flags.append(f"the call protocol{where}: {driver.error}")
        return None
    with verdict.phase(f"loaded_{role}"):
        counted = any(r.phase in COUNTED for r in driver.records)  # none: nothing to hold
        refused = loaded_code(worker, plan.fixed_dir, watch if counted else None)
        watch.close()
    if refused:
        verdict.reasons.extend(f"loaded code{where}: {p}" for p in refused[:5])
        worker.close()
        return None
    if done.result.get("seccomp", "on") != "on":
        verdict.flags.append(f"review: {done.result['seccomp']}: new native code could be "
                             "loaded during calls")
    if keep is not None:
        keep(worker)
    with verdict.phase(f"collect_{role}"):
        leftover = worker.close()
    if leftover:
        verdict.reasons.append(f"candidate left {leftover} process(es) running{where} "
                               "(killed)")
        return None
    if driver.error:
        verdict.reasons.append(f"candidate broke the call protocol{where}: {driver.error}")
        return None
    if not driver.finished and plan.cfg.check:
        verdict.reasons.append(f"candidate process ended before the judge had checked its "
                               f"calls{where}")
        return None
    try:
        clock = judge_clock(driver.records)
    except ClockError as exc:
        verdict.reasons.append(f"candidate's calls could not be timed{where}: {exc}")
        return None
    return Timed(done, clock, driver.kept())


def code_watch(worker: Worker) -> CodeWatch:
    """What the call driver calls once the candidate's calls are counted (``at_counted``):
    it holds the files the process maps as code then (``code_hold``), for ``loaded_code``."""
    return CodeWatch(worker.interpreter, _trusted(), worker.others)


def loaded_code(worker: Worker, fixed: Path, watch: CodeWatch | None = None) -> list[str]:
    """What the candidate's process loaded as code, outside the folders the judge itself
    runs from (the interpreter's, its import path, torch's, the system's) and but for the
    judge's own fixed layer (built in ``fixed``, placed beside each module), checked by its
    symbols (``build.symbols``, the single-file policy): read by the judge from the
    process's own view of its files while it is held, whatever it reports; with ``watch``,
    also the files held while the calls ran (a file unmapped since is still checked), and
    what the hold found wrong (no hold, a thread without the seccomp filter). The watch's
    files are let go."""
    try:
        pid = worker.interpreter()
        if pid is None:
            return ["the candidate's interpreter could not be found to check what it loaded"]
        symbols.require_tools()  # a judge without binutils is not a candidate's fault: raises
        found = watch.problems() if watch is not None else []
        try:
            found += [str(p) for p in mapped.check_process(
                pid, _policy(), _trusted(), own=_fixed_layer(fixed),
                held=watch.files() if watch is not None else ())]
        except Exception as exc:  # whatever the candidate mapped, it cannot take the judge down
            found.append(f"code the judge cannot check: {type(exc).__name__}: "
                         f"{str(exc)[:200]}")
        return found
    finally:
        if watch is not None:
            watch.close()


@functools.cache
def _policy() -> symbols.Policy:
    return symbols.single_file_policy(ALLOWED)


@functools.cache
def _trusted() -> tuple[Path, ...]:
    """Folders whose code the candidate did not write: the interpreter's, the judge's own
    import path (site-packages, torch's libraries) and the system's."""
    import torch

    found = {sys.prefix, sys.base_prefix, str(Path(torch.__file__).parent), "/usr", "/lib",
             "/lib64", "/etc"}
    found |= {str(Path(p).resolve()) for p in sys.path if p and Path(p).is_dir()
              and Path(p).resolve() != Path.cwd()}
    return tuple(Path(p) for p in sorted(found))


def _fixed_layer(fixed: Path) -> Callable[[str, int], bool]:
    """Whether a mapped file (its name in the process, a descriptor of it) is the judge's
    fixed layer: the same file (a hard link) as one the judge linked under ``fixed``, or
    the same bytes."""
    def own(where: str, fd: int) -> bool:
        if not Path(where).name.startswith(FIXED_PREFIX):
            return False
        try:
            info = os.fstat(fd)
        except OSError:
            return False
        for original in fixed.glob(f"*/{FIXED_PREFIX}*.so"):
            try:
                known = original.stat()
                if (known.st_ino, known.st_dev) == (info.st_ino, info.st_dev) or (
                        known.st_size == info.st_size
                        and original.read_bytes() == os.pread(fd, info.st_size + 1, 0)):
                    return True
            except OSError:
                continue
        return False

    return own


def time_again(verdict: Verdict, staging: Staging, workers: list[Worker],
               staged: list[dict[str, Any] | None], job: dict[str, Any],
               enough: Callable[[list[Timed]], bool] = lambda runs: False
               ) -> list[Timed] | None:
    """Run ``job`` (the candidate's) in each extra worker, one after another (a file
    candidate's with what the first process compiled), until ``enough`` of the extra
    timings so far says no more are needed; their timings, or None after adding the reason
    a process failed."""
    plan, runs = staging.plan, []
    if plan.cfg.split_timing:  # the GPU is warm from the process before
        warmup = max(int(job["timing"]["warmup"]), EXTRA_WARMUP_CALLS)
        job = {**job, "timing": {**job["timing"], "warmup": warmup,
                                 "warmup_s": EXTRA_WARMUP_S}}  # as the judge ends it
    for k, (worker, fields) in enumerate(zip(workers, staged, strict=True), start=2):
        if enough(runs):
            break
        if fields is None:
            with verdict.phase(f"stage_candidate{k}"), staging.turn.hold(SHARED):
                fields = staging.stage(worker)
                staging.settle([worker])
        confine.lend_inline_cache(worker, staging.snapshot, staging.kind)
        done, timed = run_candidate(verdict, staging, worker, {**job, **fields}, k)
        if timed is None:
            if not done.ok:
                leftover = worker.close()
                verdict.reasons.append(f"candidate failed in timing process {k}: "
                                       f"{done.failure}" + (f"; it left {leftover} process(es) "
                                                            "running (killed)" if leftover
                                                            else ""))
            return None
        runs.append(timed)
    return runs
