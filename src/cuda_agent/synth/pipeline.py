"""The synthesis loop: compose, filter, write, in parallel, until ``count`` tasks pass.

    cuda-agent synth --count 30 --out runs/ops30 --device cpu
    cuda-agent synth --count 6000 --out runs/ops6k --device cuda --workers 8

Candidate ``i`` is made from seed ``config.seed + i``; results are written by this thread
only, in completion order. A candidate whose only failure is the runtime window is re-sized
(``resize_attempts`` times) with its sizes scaled by the ratio of the window's centre to
its runtime. Restarting with the same folder resumes (``dataset``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

from cuda_agent.synth.catalog import load_catalog, op_class
from cuda_agent.synth.compose import Candidate, Composer, RulesComposer
from cuda_agent.synth.config import SynthConfig
from cuda_agent.synth.dataset import DatasetWriter, export_parquet, make_row
from cuda_agent.synth.filters import Checker, FilterVerdict
from cuda_agent.synth.runner import WorkerPool
from cuda_agent.synth.similarity import structure_key

Outcome = tuple[int, Candidate | None, FilterVerdict | None, float, int]


def make_composer(config: SynthConfig) -> Composer:
    catalog = load_catalog(config.catalog)
    if config.composer == "llm":
        from cuda_agent.synth.llm import LLMComposer

        return LLMComposer(catalog, config.compose, config.llm, config.device)
    return RulesComposer(catalog, config.compose, config.device)


def stochastic_ops(config: SynthConfig) -> set[str]:
    return {op.op for op in load_catalog(config.catalog) if "stochastic" in op.tags}


class Pipeline:
    """One synthesis run into ``out``."""

    def __init__(self, config: SynthConfig, out: Path,
                 on_progress: Callable[[int, int, int], None] | None = None):
        self.config = config
        self.out = out
        self.on_progress = on_progress
        self.composer = make_composer(config)
        self.classes = {op.op: op_class(op) for op in load_catalog(config.catalog)}

    def run(self) -> dict[str, Any]:
        from cuda_agent.synth.report import write_summary

        cfg = self.config
        writer = DatasetWriter(self.out, cfg.model_dump(mode="json"))
        start, session_accepted, session_candidates = time.time(), 0, 0
        with WorkerPool(cfg.workers, cfg.device, cfg.recycle_after) as pool:
            checker = Checker(cfg.filters, cfg.device, pool, cfg.kernelbench,
                              stochastic_ops(cfg))
            for row in writer.rows:
                checker.claim(row["code"], row["name"])
            ids = (i for i in range(cfg.candidate_limit) if i not in writer.done)
            running: dict[Future, int] = {}
            with ThreadPoolExecutor(cfg.workers) as threads:
                while True:
                    while (writer.accepted + len(running) < cfg.count + cfg.workers
                           and len(running) < 2 * cfg.workers
                           and writer.accepted < cfg.count):
                        task_id = next(ids, None)
                        if task_id is None:
                            break
                        running[threads.submit(self._one, checker, task_id)] = task_id
                    if not running:
                        break
                    finished, _ = wait(running, return_when=FIRST_COMPLETED)
                    for future in finished:
                        del running[future]
                        session_accepted += self._record(writer, checker, future.result())
                        session_candidates += 1
                    if self.on_progress:
                        self.on_progress(writer.accepted, len(writer.verdicts), cfg.count)
                for future in running:
                    future.cancel()
        writer.add_session({"start": start, "elapsed_s": round(time.time() - start, 3),
                            "accepted": session_accepted, "candidates": session_candidates,
                            "workers": cfg.workers, "kernelbench": str(checker.kernelbench)
                            if checker.kernelbench else None})
        writer.close()
        export_parquet(self.out)
        return write_summary(self.out, cfg)

    def _one(self, checker: Checker, task_id: int) -> Outcome:
        """Compose candidate ``task_id`` and filter it (re-sizing into the window)."""
        seed = self.config.seed + task_id
        start, scale, tries = time.time(), 1.0, 0
        candidate = verdict = None
        for attempt in range(self.config.resize_attempts + 1):
            tries = attempt + 1
            candidate = self.composer.compose(seed, scale)
            if candidate is None:
                break
            verdict = checker.check(candidate.code, candidate.ops, candidate.name,
                                    short_circuit=True)
            lo, hi = self.config.filters.window_ms(self.config.device)
            timing = ("runtime_window:", "borderline: runtime_window:")
            if not verdict.reasons or not verdict.eager_ms or not all(
                    r.startswith(timing) for r in verdict.reasons):
                break
            scale *= min(64.0, max(1 / 64, math.sqrt(lo * hi) / verdict.eager_ms))
        return task_id, candidate, verdict, time.time() - start, tries

    def _record(self, writer: DatasetWriter, checker: Checker, outcome: Outcome) -> int:
        task_id, candidate, verdict, seconds, tries = outcome
        base = {"task_id": task_id, "seconds": round(seconds, 3), "attempts": tries,
                "time": time.time()}
        if candidate is None or verdict is None:
            writer.add_verdict({**base, "name": f"synth_{task_id:08d}", "accepted": False,
                                "reasons": ["compose: no valid composition found"], "ops": []})
            return 0
        reasons = list(verdict.reasons)
        accepted = verdict.accepted
        if accepted and writer.accepted >= self.config.count:
            return 0  # surplus: left undone, so a larger run can take it
        if accepted and structure_key(candidate.code) in checker.keys:
            accepted = False
            reasons.append("not_duplicate: same normalised structure as "
                           f"{checker.keys[structure_key(candidate.code)]}")
        if accepted:
            writer.add_row(make_row(task_id, candidate.name, candidate.code, candidate.ops,
                                    candidate.data_source, candidate.composer, verdict,
                                    [self.classes.get(op, "other") for op in candidate.ops]))
            checker.claim(candidate.code, candidate.name)
        writer.add_verdict({**base, "name": candidate.name, "accepted": accepted,
                            "reasons": reasons, "ops": list(candidate.ops),
                            "data_source": candidate.data_source,
                            "eager_ms": verdict.eager_ms, "compile_ms": verdict.compile_ms,
                            "checks": verdict.checks})
        return int(accepted)
