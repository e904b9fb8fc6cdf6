"""Re-check every accepted task of a set, several times: the verdicts must agree.

    cuda-agent synth recheck OUT --times 3

Each accepted row is checked again with the run's own filters and device (as `synth check`
checks it, in fresh worker processes); a task is stable when every re-check accepts it.
Writes ``OUT/recheck.json``: per round the tasks refused and why, and the totals.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from cuda_agent.synth.config import SynthConfig
from cuda_agent.synth.dataset import CONFIG, ROWS, read_jsonl
from cuda_agent.synth.filters import Checker
from cuda_agent.synth.report import reason_code
from cuda_agent.synth.runner import WorkerPool


def recheck(out: Path, times: int = 3, workers: int | None = None,
            progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Check every accepted row of ``out`` ``times`` times; the tasks any round refused."""
    config = SynthConfig.model_validate(json.loads((out / CONFIG).read_text()))
    rows = read_jsonl(out / ROWS)
    workers = workers or config.workers
    refused: dict[str, list[list[str]]] = {}
    done = 0
    with WorkerPool(workers, config.device, config.recycle_after) as pool:
        checker = Checker(config.filters, config.device, pool, config.kernelbench)
        for _ in range(times):
            with ThreadPoolExecutor(workers) as threads:
                # the set's own tasks are not duplicates of themselves: no claims are made
                verdicts = threads.map(lambda r: checker.check(r["code"], tuple(r["ops"]),
                                                               r["name"]), rows)
                for row, verdict in zip(rows, verdicts, strict=True):
                    done += 1
                    if not verdict.accepted:
                        refused.setdefault(row["name"], []).append(list(verdict.reasons))
                    if progress:
                        progress(done, times * len(rows))
    reasons = Counter(reason_code(r) for runs in refused.values() for reasons in runs
                      for r in reasons)
    result = {"out": str(out), "tasks": len(rows), "times": times,
              "stable": len(rows) - len(refused), "refused_tasks": len(refused),
              "refusals": sum(len(v) for v in refused.values()),
              "reasons": dict(reasons.most_common()), "refused": refused}
    (out / "recheck.json").write_text(json.dumps(result, indent=1))
    return result
