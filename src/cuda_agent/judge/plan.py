"""The secrets, jobs and files of one judgement, and reading what its workers sent back.

Every random choice of a judgement comes from one keyed generator (``secret.Keyed``),
keyed by the judgement's seed (``JudgeConfig.seed``, or 128 secret bits); the seeds of the
calls, which calls are kept, the reference's weights seed and the key of the inputs'
digests are all drawn from it, and none can be worked out from another.
The candidate's job holds none of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from cuda_agent.judge import baselines as baseline_cache
from cuda_agent.judge.budget import KeptPlan, fit_time, plan_kept
from cuda_agent.judge.compare import eager_errors, timed_slack
from cuda_agent.judge.config import JUDGE_VERSION, JudgeConfig
from cuda_agent.judge.driver import DriverPlan, Snapshot
from cuda_agent.judge.runner import Worker, WorkerOutcome
from cuda_agent.judge.secret import Keyed
from cuda_agent.judge.transport import TransportError, open_pack, pack_size, unpack
from cuda_agent.judge.worker import without_model
from cuda_agent.tasks.task import Task
from cuda_agent.tasks.tolerance import declared

STAND_INS = 16
STAND_INS_S = 1.0
"""Stand-in calls a worker makes before any candidate code (the protocol's own cost): 16,
or from ``driver.CALIBRATE_FLOOR`` on once they took a second (a large task's stand-ins
make and pack its inputs, a few tenths of a second each on the CPU)."""
WALL_SHARE_CUDA = 0.25
"""On CUDA, the share of a candidate's calls made as wall calls (timed by the judge's clock
alone); the others go through the device timer."""
EXTRA_KEEP = 2
"""Calls kept in each extra timing process (``candidate_processes`` > 1)."""
EXTRA_WARMUP_S = 0.05
EXTRA_WARMUP_CALLS = 10
"""An extra process's warm-up with ``split_timing``: at least this many calls and 0.05 s
(the first process's: 0.2 s). The GPU has just run the process before it, so its clocks
are up; the calls cover the process's own first call (module loading, the allocator's
first blocks), which no earlier call has made there."""


class JudgeError(RuntimeError):
    """The judgement could not be made (e.g. the reference itself fails): not a verdict."""


@dataclass(frozen=True)
class Reference:
    """The reference's answers for the kept calls, in the order they were asked for."""

    outputs: list[list[torch.Tensor]]
    wide: list[list[torch.Tensor]]
    """Float64 twins of the first ``len(wide)`` calls."""
    digests: list[list[str]]
    eager: list[list[Any]]
    """Eager's own error against each twin (``compare.eager_errors``)."""
    slack: list[list[float]]
    """The element-wise slack of calls without a twin (``compare.timed_slack``)."""


class JudgePlan:
    """The secrets, jobs and files of one judgement."""

    def __init__(self, cfg: JudgeConfig, task: Task, device: str, seed: int, tmp: Path):
        self.cfg, self.task, self.device, self.tmp, self.seed = cfg, task, device, tmp, seed
        self.rng = Keyed(seed)
        self.key = self.rng.getrandbits(62)
        self.init_seed = self.rng.getrandbits(62)
        self.timing = {"warmup": cfg.warmup, "min_runs": cfg.min_runs,
                       "floor_runs": min(cfg.floor_runs, cfg.min_runs),
                       "max_runs": cfg.max_runs, "budget_s": cfg.time_budget_s,
                       "warmup_budget_s": cfg.warmup_budget_s,
                       "target_rel_ci": cfg.rel_ci_for(device)}
        """What the workers' timing loops are told, and the baselines' cache key: the judge
        holds each worker to it (``driver_plan``, ``baseline_driver``)."""
        self.baseline_processes = cfg.baseline_processes_for(device)
        self.baseline_key = baseline_cache.cache_key(
            task.sha256, device, task.precision.value, JUDGE_VERSION,
            {**self.timing, **({"processes": self.baseline_processes}
                               if self.baseline_processes > 1 else {})}, cfg.time_compile)
        self.fixed_dir = cfg.build.resolved_cache() / "fixed"
        """Where the judge links its fixed layer: its copies are not the candidate's code."""
        self.kept: KeptPlan | None = None
        self.sizes: dict[str, list[int]] = {}
        self.aliases: list[list[int]] = []

    def candidate_timing(self) -> dict[str, Any]:
        """The candidate's timing settings: the baselines' own, unless ``split_timing``
        shares the interval among the candidate's processes."""
        processes = self.cfg.candidate_processes_for(self.device)
        if not self.cfg.split_timing or processes < 2:
            return self.timing
        return {**self.timing, "target_rel_ci": self.timing["target_rel_ci"] * processes ** 0.5}

    def cached_baselines(self) -> baseline_cache.Baselines | None:
        if not self.cfg.cache_baselines:
            return None
        found = baseline_cache.load(self.baseline_key)
        if found and self.cfg.time_compile and found.compile is None:
            return None
        return found

    def job(self, role: str, time: bool | None = None, **extra: Any) -> dict[str, Any]:
        """A worker's job. The candidate's holds the task without ``Model`` and no seed."""
        job = {"role": role, "device": self.device, "precision": self.task.precision.value,
               "time": self.cfg.time if time is None else time, "timing": self.timing,
               "state_path": str(self.tmp / "state.pt"), "activity": self.cfg.activity_record,
               "output_budget_gb": self.cfg.output_budget_gb, "check": self.cfg.check}
        if role == "candidate":
            job.update(task_code=without_model(self.task.code), aliases=self.aliases,
                       kept_bytes={"outputs": self.sizes.get("outputs", [])},
                       poison_bytes=2 * (sum(self.sizes.get("outputs", []))
                                         + sum(self.sizes.get("inputs", []))))
        else:
            job.update(task_code=self.task.code, init_seed=self.init_seed,
                       float64=self.cfg.float64_check)
            if role == "reference" and self.cfg.check:
                atol, rtol = declared(self.task.precision.value, self.cfg.atol, self.cfg.rtol)
                job["degenerate"] = {"trials": self.cfg.trials, "scales": list(self.cfg.scales),
                                     "atol": atol, "rtol": rtol}
        return {**job, **extra}

    def learn(self, first: dict[str, Any], processes: int) -> str | None:
        """The reference's first report: the sizes of a call's outputs and inputs, and which
        outputs share an input's memory; plans the kept calls (``budget``) and returns the
        verdict's note when that is fewer than configured."""
        try:
            sizes = {k: [int(n) for n in first["sizes"][k]]
                     for k in ("outputs", "wide", "inputs")}
            aliases = [[int(k), int(j)] for k, j in first.get("aliases", [])]
        except (KeyError, TypeError, ValueError) as exc:
            raise JudgeError(f"the reference reported bad sizes: {exc}") from None
        self.sizes, self.aliases = sizes, aliases
        call = pack_size(sizes["outputs"]) * 2 + pack_size(sizes["inputs"])
        budget = int(self.cfg.output_budget_gb * 2**30)
        planned = plan_kept(self.cfg.trials, tuple(self.cfg.scales), EXTRA_KEEP, processes,
                            call, pack_size(sizes["wide"]), 1 << 62,
                            bool(first.get("float64")) and self.cfg.float64_check)
        self.kept = plan_kept(self.cfg.trials, tuple(self.cfg.scales), EXTRA_KEEP, processes,
                              call, pack_size(sizes["wide"]), budget,
                              bool(first.get("float64")) and self.cfg.float64_check)
        notes = [self.kept.note(planned, budget)] if self.kept.reduced else []
        call_s = first.get("call_s")
        if self.cfg.check_budget_s is not None and type(call_s) is float and call_s > 0:
            self.kept, slow = fit_time(self.kept, processes, call_s, self.cfg.check_budget_s)
            notes += [slow] if slow else []
        return "; ".join(notes) or None

    def checked_order(self, kept: list[Snapshot]) -> list[Snapshot]:
        """The kept calls in the order the reference answers them: the first ``wide`` get a
        float64 twin, so where not all do, a call at scale 1 comes first (the calls without
        a twin take their element-wise slack from the twinned ones at scale 1)."""
        wide = self.kept.wide if self.kept is not None else 0
        first = next((s for s in kept if s.scale == 1.0), None)
        if not 0 < wide < len(kept) or first is None:
            return kept
        return [first, *(s for s in kept if s is not first)]

    def pack_bytes(self) -> int | None:
        """The candidate's pack: one kept call's outputs and inputs (each kept call is read
        by the judge before the next is made); None when nothing is kept."""
        if not self.cfg.check or not self.sizes:
            return None
        return pack_size([*self.sizes["outputs"], *self.sizes["inputs"]]) or None

    def driver_plan(self, process: int) -> DriverPlan:
        """How the judge drives candidate process ``process`` (1: the first)."""
        kept = self.kept
        keep = 0 if kept is None or not self.cfg.check else (
            kept.keep if process == 1 else kept.extra)
        scales = kept.scales if kept is not None and self.cfg.check and process == 1 else ()
        timing = self.candidate_timing()
        warmup, warmup_s = int(timing["warmup"]), self._warmup_s()
        if process > 1 and self.cfg.split_timing:  # the GPU is warm from the process before
            warmup, warmup_s = max(warmup, EXTRA_WARMUP_CALLS), min(warmup_s, EXTRA_WARMUP_S)
        return DriverPlan(keep=keep, scales=scales, wall_share=self.wall_share(),
                          expected_calls=int(timing["min_runs"]), warmup=warmup,
                          warmup_s=warmup_s,
                          record=self.device.startswith("cuda") and self.cfg.activity_record,
                          timed=self.cfg.time or process > 1, rng=self.rng.child(),
                          **self._timed_phases(timing))

    def _timed_phases(self, timing: dict[str, Any]) -> dict[str, Any]:
        """The ``DriverPlan`` fields that end the stand-ins, the warm-up and the timed
        calls, for the candidate and the baselines alike."""
        return {"calibrate": STAND_INS, "calibrate_s": STAND_INS_S,
                "warmup_budget_s": float(timing["warmup_budget_s"]),
                "min_runs": int(timing["min_runs"]), "floor_runs": int(timing["floor_runs"]),
                "budget_s": float(timing["budget_s"])}

    def _warmup_s(self) -> float:
        """The warm-up's seconds on CUDA (clocks ramp up); none on the CPU."""
        return 0.2 if self.device.startswith("cuda") else 0.0

    def baseline_driver(self, timing: dict[str, Any] | None = None) -> DriverPlan:
        """How the judge drives a baseline's timing calls (nothing kept), to ``timing``
        (the judgement's own where None; a cached baseline's fresh check is shorter)."""
        return DriverPlan(keep=0, wall_share=self.wall_share(), warmup=self.cfg.warmup,
                          warmup_s=self._warmup_s(), rng=self.rng.child(),
                          **self._timed_phases(timing or self.timing))

    def wall_share(self) -> float:
        return WALL_SHARE_CUDA if self.device.startswith("cuda") else 1.0

    def kept_job(self, kept: list[Snapshot], wide: int) -> dict[str, Any]:
        """The reference's further job: the kept calls' outputs (float64 twins for the
        first ``wide``) and their inputs' digests."""
        sets = [[s.seed, s.scale, k < wide] for k, s in enumerate(kept)]
        reserve = len(sets) * pack_size(self.sizes["outputs"]) + wide * pack_size(
            self.sizes["wide"])
        return {"sets": sets, "key": self.key, "reserve": reserve}

    def collect_reference(self, outcome: WorkerOutcome, worker: Worker, scales: list[float]
                          ) -> Reference:
        """The reference's answers for the kept calls (``kept_job``; ``scales``: theirs)."""
        record = outcome.result.get("outputs")
        try:
            if not isinstance(record, dict) or not isinstance(record.get("sets"), list):
                raise TransportError("no outputs reported")
            folder = worker.out_dir / str(record.get("folder", ""))
            buffer = open_pack(record.get("pack"), folder, self.device)
            outputs, wide, digests = [], [], []
            for entry in record["sets"]:
                outputs.append(unpack(buffer, entry["out"]))
                if entry.get("out64") is not None:
                    wide.append(unpack(buffer, entry["out64"]))
                digests.append([str(d) for d in entry["digest"]])
        except (TransportError, KeyError, TypeError) as exc:
            raise JudgeError(f"reference outputs unreadable: {exc}") from None
        wide = wide[:len(outputs)]
        eager = eager_errors(outputs[:len(wide)], wide, outcome.result.get("fan_in"))
        return Reference(outputs, wide, digests, eager,
                         timed_slack(eager, scales[:len(wide)], self.task.precision.value))


MAX_KEPT_TENSORS = 256


def kept_reader(worker: Worker, device: str, limit: int | None) -> Any:
    """How the judge reads a kept call from ``worker``'s pack, the moment the worker says
    ``done``: each tensor copied into memory of the judge's own (a later write by the
    candidate changes nothing), after every descriptor was checked against the pack and
    ``limit``, the bytes one right call's outputs and inputs take (a longer description is
    refused, not read). The limit holds for all the descriptors together: each alone within
    the pack could still describe the whole pack many times over, and the judge would copy
    it as often."""
    from cuda_agent.judge.calls import ProtocolError

    def read(message: dict[str, Any]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        kind, outs, ins = message.get("pack"), message.get("outputs"), message.get("inputs")
        if not isinstance(outs, list) or not isinstance(ins, list) or \
                len(outs) + len(ins) > MAX_KEPT_TENSORS:
            raise ProtocolError("a call without a list of outputs and inputs")
        described = sum(abs(d.get("nbytes")) for d in (*outs, *ins)
                        if isinstance(d, dict) and type(d.get("nbytes")) is int)
        if limit is not None and described > limit:
            raise ProtocolError(f"kept outputs unreadable: {described} bytes described in "
                                f"all, at most {limit} expected")
        try:
            return [_read(d, kind, worker, device, limit) for d in outs], \
                [_read(d, kind, worker, device, limit) for d in ins]
        except (TransportError, ValueError) as exc:
            raise ProtocolError(f"kept outputs unreadable: {exc}") from None

    return read


def _read(descriptor: Any, kind: Any, worker: Worker, device: str, limit: int | None
          ) -> torch.Tensor:
    """One tensor of a kept call, copied out of the pack."""
    from cuda_agent.judge import shared_pack

    if not isinstance(descriptor, dict):
        raise TransportError("a descriptor that is not an object")
    offset, nbytes = descriptor.get("offset"), descriptor.get("nbytes")
    if type(offset) is not int or type(nbytes) is not int or offset < 0 or nbytes < 0:
        raise TransportError("a descriptor without a valid offset and size")
    if limit is not None and offset + nbytes > limit:
        raise TransportError(f"{offset + nbytes} bytes described, at most {limit} expected")
    local = {**descriptor, "offset": 0}
    if kind == "cuda-fd" and worker.device_pack is not None:
        if offset + nbytes > worker.device_pack.size:
            raise TransportError(f"{offset + nbytes} bytes described, "
                                 f"{worker.device_pack.size} lent")
        window = worker.device_pack.tensor()[offset:offset + nbytes]
        copy = unpack(window, [local])[0].clone()
        if copy.is_cuda:
            torch.cuda.synchronize(copy.device)
        return copy
    if kind != "memfd" or worker.pack_fd is None:
        raise TransportError(f"a pack of kind {kind!r}, not one this worker was lent")
    return unpack(shared_pack.read(worker.pack_fd, nbytes, device, offset), [local])[0]
