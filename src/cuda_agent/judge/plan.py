"""The seeds, jobs and files of one judgement, and reading what its workers sent back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cuda_agent.judge import baselines as baseline_cache
from cuda_agent.judge import device_pack
from cuda_agent.judge.budget import OutputPlan
from cuda_agent.judge.compare import eager_errors, timed_slack
from cuda_agent.judge.config import JUDGE_VERSION, JudgeConfig
from cuda_agent.judge.runner import Worker, WorkerOutcome
from cuda_agent.judge.transport import TransportError, open_pack, pack_kind, unpack
from cuda_agent.judge.worker import without_model
from cuda_agent.tasks.task import Task


class JudgeError(RuntimeError):
    """The judgement could not be made (e.g. the reference itself fails): not a verdict."""


class JudgePlan:
    """The seeds, jobs and files of one judgement."""

    def __init__(self, cfg: JudgeConfig, task: Task, device: str, seed: int, tmp: Path):
        self.cfg, self.task, self.device, self.tmp = cfg, task, device, tmp
        self.trials = [[seed + i, 1.0] for i in range(cfg.trials)]
        self.trials += [[seed + 500 + j, s] for j, s in enumerate(cfg.scales)]
        self.fresh_trials = cfg.trials
        self.timing_seeds = [seed + 1000 + k for k in range(2)]
        self.fresh_seed = seed + 2000
        self.init_seed = seed
        self.timing = {"warmup": cfg.warmup, "min_runs": cfg.min_runs,
                       "max_runs": cfg.max_runs, "budget_s": cfg.time_budget_s,
                       "target_rel_ci": cfg.rel_ci_for(device)}
        self.baseline_processes = cfg.baseline_processes_for(device)
        self.baseline_key = baseline_cache.cache_key(
            task.sha256, device, task.precision.value, JUDGE_VERSION,
            {**self.timing, **({"processes": self.baseline_processes}
                               if self.baseline_processes > 1 else {})}, cfg.time_compile)

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

    def keep(self, kept: Any) -> str | None:
        """Run only the trials and timed sets the reference reported (``judge.budget``);
        the verdict's note when that is fewer than planned."""
        if kept is None:
            return None
        try:
            indices, wide, timed = kept["trials"], int(kept["wide"]), int(kept["timed"])
            out_bytes = int(kept["out_bytes"])
            trials = [self.trials[i] for i in indices]
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise JudgeError(f"the reference reported a bad output plan: {exc}") from None
        if not trials or not 0 <= timed <= len(self.timing_seeds):
            raise JudgeError(f"the reference reported a bad output plan: {kept}")
        n_trials, n_timed = len(self.trials), len(self.timing_seeds)
        if not kept.get("reduced"):
            if len(trials) != n_trials or timed != n_timed:
                raise JudgeError(f"the reference reported a bad output plan: {kept}")
            return None
        self.trials, self.timing_seeds = trials, self.timing_seeds[:timed]
        plan = OutputPlan(tuple(indices), wide, timed, out_bytes, True)
        return plan.note(n_trials, n_timed, int(self.cfg.output_budget_gb * 2**30))

    def job(self, role: str, time: bool | None = None, **extra: Any) -> dict[str, Any]:
        code = without_model(self.task.code) if role == "candidate" else self.task.code
        return {"role": role, "task_code": code, "device": self.device,
                "init_seed": self.init_seed, "trials": self.trials,
                "timing_seeds": self.timing_seeds, "fresh_seed": self.fresh_seed,
                "fresh_trials": self.fresh_trials, "check": self.cfg.check,
                "output_budget_gb": self.cfg.output_budget_gb,
                "time": self.cfg.time if time is None else time,
                "precision": self.task.precision.value, "float64": self.cfg.float64_check,
                "state_path": str(self.tmp / "state.pt"), "timing": self.timing,
                "activity": self.cfg.activity_record, **extra}

    def pack_bytes(self, reference: dict[str, Any], with_trials: bool = True) -> int | None:
        """Bytes of the candidate's output pack if its outputs match the reference's, its
        trials' outputs too unless ``with_trials`` is off (None when nothing is checked, so
        its outputs' sizes are unknown, or when it has no outputs to send)."""
        groups = [*(reference["out"] if with_trials else []),
                  *(reference["timed"] if self.cfg.time else [])]
        if not self.cfg.check or not groups:
            return None
        return device_pack.pack_bytes(groups)

    def _tensors(self, outcome: WorkerOutcome, worker: Worker, kind: str | None = None
                 ) -> tuple[dict, Any]:
        record = outcome.result.get("outputs")
        if not isinstance(record, dict):
            raise TransportError("the worker reported no outputs")
        if kind == "cuda-fd" and not worker.ended:
            raise TransportError("a lent device pack is read only once its worker has ended")
        # compare on the device: large outputs compare far faster there than on the CPU
        return record, open_pack(record.get("pack"), worker.out_dir, self.device,
                                 kind or pack_kind(self.device, confined=False),
                                 worker.pack_fd, worker.device_pack)

    def collect_reference(self, outcome: WorkerOutcome, worker: Worker) -> dict[str, Any]:
        """The reference's trial outputs, their float64 twins, the timed sets' outputs,
        eager's own error in each twinned trial (``compare.eager_errors``) and the timed
        sets' element-wise slack."""
        if not self.cfg.check:
            return {"out": [], "out64": None, "timed": [], "eager": [], "timed_slack": []}
        try:
            record, buffer = self._tensors(outcome, worker)
            wide = record.get("out64")
            out = [unpack(buffer, d) for d in record["trials"]]
            out64 = [unpack(buffer, d) for d in wide] if wide else None
            timed = [unpack(buffer, d) for d in record["timed"]]
        except (TransportError, KeyError) as exc:
            raise JudgeError(f"reference outputs unreadable: {exc}") from None
        eager = eager_errors(out, out64)
        return {"out": out, "out64": out64, "timed": timed, "eager": eager,
                "timed_slack": timed_slack(eager, [scale for _, scale in self.trials],
                                            self.task.precision.value)}

    def collect_candidate(self, outcome: WorkerOutcome, worker: Worker, kind: str,
                          with_trials: bool = True
                          ) -> tuple[list[list[Any]], list[dict[str, Any]]]:
        """The trial outputs (``with_trials``: the job ran them) and the timed outputs (with
        their input-set index)."""
        record, buffer = self._tensors(outcome, worker, kind)
        ran = self.trials if with_trials and self.cfg.check else []
        trials, timed = record.get("trials"), record.get("timed")
        if not isinstance(trials, list) or not isinstance(timed, list):
            raise TransportError("output record lacks trials or timed outputs")
        if len(trials) != len(ran):
            raise TransportError(f"{len(trials)} trials reported, {len(ran)} run")
        timed_out = []
        for entry in timed:
            variant = entry.get("variant") if isinstance(entry, dict) else None
            if type(variant) is not int or not 0 <= variant < len(self.timing_seeds):
                raise TransportError("a timed output names no checked input set")
            timed_out.append({"variant": variant, "out": unpack(buffer, entry.get("out"))})
        return [unpack(buffer, d) for d in trials], timed_out

    def collect_and_close(self, outcome: WorkerOutcome, worker: Worker, kind: str,
                          with_trials: bool = True) -> tuple[Any, str | None, int]:
        """A candidate worker's outputs (``collect_candidate``'s pair, or None and why they
        are unreadable), then the worker closed: how many processes it left. A worker lent
        a device pack is ended first: nothing of the candidate's may write it from then."""
        if kind == "cuda-fd":
            worker.end()
        try:
            got, error = self.collect_candidate(outcome, worker, kind, with_trials), None
        except TransportError as exc:
            got, error = None, str(exc)
        return got, error, worker.close()
