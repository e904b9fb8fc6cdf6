"""The size a task is judged at on the CPU (``JudgeConfig.cpu_size``).

KernelBench's tasks are sized for GPUs (``1/19`` takes a 6 GiB input), and their sizes are
module-level constants. On the CPU, ``auto`` judges a task at its own size where a call
fits the workers' memory limit (``memory.call_fits``) and otherwise at a reduced size
(``tasks.sizes``): its constants halved, largest first, until a call's inputs, outputs and
weights are within ``cpu_call_mb`` and its operations within ``cpu_call_gflop``, so the
judgement stays fast too. ``reduced`` reduces any task over those caps; ``full`` never
reduces. The reduced task is a task of its own: reference and candidate both run it, and its
baselines are cached under its own code. The verdict names every constant changed; a
candidate written for the task's own sizes only fails there, and the verdict says why.
"""

from __future__ import annotations

import dataclasses

from cuda_agent.judge.config import JudgeConfig
from cuda_agent.judge.memory import call_fits, worker_limit
from cuda_agent.results import JudgeResult
from cuda_agent.tasks.sizes import SizeBudget, Sizing, human_bytes, reduced_task, size_task
from cuda_agent.tasks.task import Task, TaskError

NOTE = "judged at a reduced size: "
"""How the verdict's note on a reduced size begins."""


def size_budget(config: JudgeConfig, device: str) -> SizeBudget | None:
    """What a call may take on ``device``; None where tasks run at their own size (CUDA, or
    ``cpu_size='full'``)."""
    if device != "cpu" or config.cpu_size == "full":
        return None
    limit = worker_limit(config, device)
    return SizeBudget(fit_bytes=None if limit is None else call_fits(limit),
                      cap_bytes=int(config.cpu_call_mb * 2**20),
                      cap_flops=config.cpu_call_gflop * 1e9,
                      always=config.cpu_size == "reduced", limit_bytes=limit)


def judged_task(task: Task, config: JudgeConfig, device: str) -> tuple[Task, Sizing | None]:
    """``task`` at the size it is judged at on ``device``, and how it was sized (None: not
    measured; a task whose size cannot be measured runs at its own, and its reference
    says why where it fails)."""
    budget = size_budget(config, device)
    if budget is None:
        return task, None
    try:
        sizing = size_task(task, budget)
    except TaskError:
        return task, None
    return reduced_task(task, sizing), sizing


def workspace_sizing(task: Task, device: str, config: JudgeConfig | None = None
                     ) -> Sizing | None:
    """How the judge of a workspace's episode sizes ``task`` on ``device`` (its SKILL.md
    says so): ``config``, or the judge's defaults."""
    return judged_task(task, config or JudgeConfig(device=device), device)[1]


def note(sizing: Sizing, config: JudgeConfig, device: str) -> str:
    """The verdict's line on a reduced size: what changed and why."""
    limit = worker_limit(config, device)
    why = (f"over the {human_bytes(call_fits(limit))} that fits the CPU workers' memory limit of "
           f"{human_bytes(limit)}" if config.cpu_size == "auto" and limit is not None
           else "reduced on request (cpu_size=reduced)")
    reached = "" if sizing.reached else (
        f", still over cpu_call_mb={config.cpu_call_mb:g} or "
        f"cpu_call_gflop={config.cpu_call_gflop:g}: no constant could be halved further")
    return (f"{NOTE}{sizing.describe()} (a call's inputs, outputs and weights: "
            f"{human_bytes(sizing.full.bytes)} at the task's own size, {why}; "
            f"{human_bytes(sizing.judged.bytes)} as judged{reached}; --set cpu_size=full judges "
            f"the task's own size)")


def marked(result: JudgeResult, sizing: Sizing | None, config: JudgeConfig) -> JudgeResult:
    """``result`` saying the size it was judged at; a candidate that ran but failed is told
    that it must work at any size."""
    if sizing is None or not sizing.reduced:
        return result
    reasons = result.reasons
    if result.compiled and not result.correct:
        reasons += (f"the task ran at a reduced size ({sizing.describe()}), not model.py's: "
                    "a candidate must work at any size the task's constants give",)
    return dataclasses.replace(result, size=sizing.changes, reasons=reasons,
                               flags=(note(sizing, config, result.device), *result.flags))


def reference_note(sizing: Sizing | None) -> str:
    """What a failing reference's error adds about the size it ran at."""
    if sizing is None or sizing.reached and not sizing.reduced:
        return ""
    if not sizing.reduced:
        return (" (no reduced size could be made: the task's sizes are not module-level "
                "integer constants)")
    return (f" ({NOTE}{sizing.describe()}; --set cpu_size=full judges the task's own "
            "size)")
