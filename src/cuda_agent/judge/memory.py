"""The CPU workers' memory limit, and the one-line error when the task's reference does not
fit in it.

Each CPU worker runs under an address-space limit (``RLIMIT_AS``): an allocation past it
fails in that worker alone, where the machine's OOM killer would otherwise pick a process of
its own choosing, the judge included. Unset (``JudgeConfig.memory_limit_gb`` None), the
limit is taken from the machine: ``MACHINE_SHARE`` of its physical memory, the rest left to
the judge (which copies the reference's outputs) and the system, split evenly between the
workers alive at once - the held reference, the candidate's processes and one baseline -
and never under ``FLOOR_BYTES``, what importing torch alone reserves and then some.
"""

from __future__ import annotations

import os
import re
import signal

from cuda_agent.judge.config import JudgeConfig
from cuda_agent.judge.report import WorkerOutcome

MACHINE_SHARE = 0.75
"""The part of the machine's physical memory its CPU workers share."""
FLOOR_BYTES = 2 << 30
"""The least a machine-derived limit gives a worker."""
CALL_FACTOR = 6
TORCH_BYTES = 1 << 30
"""What the reference's worker takes for a task: ``TORCH_BYTES`` (the interpreter and torch)
plus ``CALL_FACTOR`` times one call's inputs, outputs and weights (the call, its float64
twin, the checked calls' outputs kept for the candidate). A task of 512 MiB inputs and
outputs each peaked at 5.6 GiB of address space in the reference's worker."""
_ALLOCATION = re.compile(r"tried to allocate (\d+) bytes")
_OUT_OF_MEMORY = ("MemoryError", "DefaultCPUAllocator", "Cannot allocate memory",
                  "std::bad_alloc", f"killed by {signal.SIGKILL.name}")
"""What a worker's failure says when it ran out of memory: an allocation refused under the
limit (Python's, torch's allocator's, C++'s) or the OOM killer's SIGKILL."""


def physical_bytes() -> int:
    """The machine's physical memory."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def workers_at_once(config: JudgeConfig, device: str) -> int:
    """The worker processes a judgement keeps alive at once: the held reference, the
    candidate's processes and one baseline."""
    return 1 + config.candidate_processes_for(device) + 1


def worker_limit(config: JudgeConfig, device: str) -> int | None:
    """The address-space limit of ``device``'s workers in bytes (None: no limit, on CUDA)."""
    if device != "cpu":
        return None
    if config.memory_limit_gb is not None:
        return int(config.memory_limit_gb * 2**30)
    share = int(physical_bytes() * MACHINE_SHARE) // workers_at_once(config, device)
    return max(FLOOR_BYTES, share)


def call_fits(limit: int) -> int:
    """The largest call (inputs, outputs and weights, in bytes) whose reference fits in a
    worker limited to ``limit`` bytes."""
    return max(0, limit - TORCH_BYTES) // CALL_FACTOR


def out_of_memory(done: WorkerOutcome) -> bool:
    """Whether ``done`` failed for want of memory."""
    return not done.ok and any(mark in (done.failure or "") for mark in _OUT_OF_MEMORY)


def reference_error(task: str, done: WorkerOutcome, limit: int | None, where: str = "") -> str:
    """Why the reference failed: one line naming the memory limit, the inputs' size where
    the worker made them, and what to do, when it ran out of memory; its failure and the
    tail of its stderr otherwise."""
    if limit is None or not out_of_memory(done):
        tail = done.stderr_tail[-800:].strip()
        return f"reference failed{where} for task {task}: {done.failure}" + (
            f"\n{tail}" if tail else "")
    sizes = []
    if done.result.get("input_bytes"):
        sizes.append(f"inputs of {_gib(done.result['input_bytes'])}")
    if f"killed by {signal.SIGKILL.name}" in (done.failure or ""):
        sizes.append(f"its process killed by {signal.SIGKILL.name}, as the OOM killer does")
    asked = _ALLOCATION.search(done.failure or "")
    if asked:
        sizes.append(f"an allocation of {_gib(int(asked.group(1)))}")
    how = f" ({', '.join(sizes)})" if sizes else ""
    return (f"task {task}'s reference does not fit in the CPU workers' memory limit of "
            f"{_gib(limit)}{how}: run it on CUDA (--device cuda), at a reduced size "
            f"(--set cpu_size=reduced), at a smaller shape (--shape, for a task declaring "
            f"INPUT_SHAPES), or with a higher limit (--set memory_limit_gb=N) on a machine "
            f"with the memory")


def _gib(count: int) -> str:
    return f"{count / 2**30:.2f} GiB"
