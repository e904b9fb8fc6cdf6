"""``cuda-agent baselines`` over every GPU of a machine: one process per GPU, each pinned to
its GPU (``CUDA_VISIBLE_DEVICES``) and measuring its shard of the tasks, all appending to the
one rows file of ``--out``, so a rerun resumes whatever any of them finished.

A GPU's timing needs the whole GPU, so one task at a time runs on each; the processes share
nothing but the rows file, whose lines each go down in one append (``baselines.write_row``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from cuda_agent.evaluate.baselines import ROWS


def visible_gpus(asked: str) -> list[str]:
    """The GPUs ``--gpus`` names: ``auto`` (every visible one), a count (the first N), or a
    comma-separated list of indices."""
    if asked == "auto":
        import torch

        return [str(i) for i in range(torch.cuda.device_count())]
    if asked.isdigit():
        return [str(i) for i in range(int(asked))]
    found = [p.strip() for p in asked.split(",") if p.strip()]
    if not found or not all(p.isdigit() for p in found):
        raise ValueError(f"--gpus {asked!r}: expected auto, a count or indices such as 0,2")
    return found


def spread(gpus: list[str], child_argv: Callable[[int, int], list[str]], out: Path,
           total: int, progress: Callable[[int], None] | None = None) -> list[int]:
    """Run ``child_argv(k, n)`` for each GPU k of n, pinned to it; call ``progress`` with the
    rows written so far while they run. Their exit codes, in GPU order."""
    procs = []
    for k, gpu in enumerate(gpus):
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpu}
        procs.append(subprocess.Popen(child_argv(k, len(gpus)), env=env,
                                      stdout=subprocess.DEVNULL))
    try:
        while any(p.poll() is None for p in procs):
            if progress is not None:
                progress(min(total, _rows(out)))
            time.sleep(1.0)
    finally:
        for p in procs:  # interrupted: the rows written so far stay, a rerun resumes them
            if p.poll() is None:
                p.terminate()
                p.wait()
    if progress is not None:
        progress(min(total, _rows(out)))
    return [p.returncode for p in procs]


def cli_child(options: list[str]) -> Callable[[int, int], list[str]]:
    """A child's command line: this CLI's ``baselines`` with ``options`` and its shard."""
    def argv(k: int, n: int) -> list[str]:
        return [sys.executable, "-m", "cuda_agent", "baselines", *options,
                "--shard", f"{k}/{n}", "--gpus", "1", "--quiet"]

    return argv


def _rows(out: Path) -> int:
    try:
        with open(out / ROWS, "rb") as rows:
            return sum(1 for _ in rows)
    except FileNotFoundError:
        return 0
