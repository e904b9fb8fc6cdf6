"""The CPU workers' memory limit: taken from the machine unless set, and a task whose
reference does not fit in it ends the judgement with one clear line, from the library and
from the command."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cuda_agent.judge import Candidate, Judge, JudgeConfig
from cuda_agent.judge.memory import (
    FLOOR_BYTES,
    out_of_memory,
    physical_bytes,
    reference_error,
    worker_limit,
)
from cuda_agent.judge.plan import JudgeError
from cuda_agent.judge.report import outcome
from cuda_agent.tasks import load_task

TASK = textwrap.dedent("""\
    import torch


    class Model(torch.nn.Module):
        def forward(self, x):
            return x * 2.0


    def get_inputs():
        return [torch.rand({n})]


    def get_init_inputs():
        return []
    """)
CANDIDATE = textwrap.dedent("""\
    import torch


    class ModelNew(torch.nn.Module):
        def forward(self, x):
            return x * 2.0
    """)
BIG = 2**30
"""Elements of the big task's input: 4 GiB of float32, refused at once under a 2 GiB limit
(the allocation fails before any page is touched, so the test costs no memory)."""


def write_task(folder: Path, elements: int, forward: str = "x * 2.0") -> tuple[Path, Path]:
    task = folder / "task.py"
    task.write_text(TASK.format(n=elements).replace("x * 2.0", forward))
    candidate = folder / "candidate.py"
    candidate.write_text(CANDIDATE)
    return task, candidate


def test_the_default_limit_is_a_share_of_the_machine():
    assert JudgeConfig().memory_limit_gb is None
    machine = int(physical_bytes() * 0.75)
    assert worker_limit(JudgeConfig(), "cpu") == max(FLOOR_BYTES, machine // 3)
    more = JudgeConfig(candidate_processes=3)  # reference, 3 candidates, a baseline
    assert worker_limit(more, "cpu") == max(FLOOR_BYTES, machine // 5)
    assert worker_limit(JudgeConfig(memory_limit_gb=1.5), "cpu") == int(1.5 * 2**30)
    assert worker_limit(JudgeConfig(), "cuda") is None
    assert worker_limit(JudgeConfig(memory_limit_gb=1.5), "cuda:0") is None


def test_a_reference_killed_by_the_oom_killer_is_said_not_to_fit():
    killed = outcome(None, "forward", -9, False, 600.0)
    assert out_of_memory(killed)
    line = reference_error("big", killed, 3 * 2**30)
    assert "\n" not in line
    assert "does not fit in the CPU workers' memory limit of 3.00 GiB" in line
    assert "killed by SIGKILL" in line and "--device cuda" in line and "--shape" in line
    report = '{"ok": false, "stage": "forward", "error": "MemoryError: ", "input_bytes": %d}'
    refused = outcome(report % (3 << 29), None, 0, False, 600.0)
    assert out_of_memory(refused)
    assert "limit of 1.00 GiB (inputs of 1.50 GiB)" in reference_error("big", refused, 2**30)
    crashed = outcome(None, "forward", -11, False, 600.0)
    assert not out_of_memory(crashed)
    assert reference_error("big", crashed, 3 * 2**30).startswith("reference failed")


def test_a_reference_over_the_limit_ends_with_one_clear_line(tmp_path: Path):
    task, candidate = write_task(tmp_path, BIG)
    config = JudgeConfig(device="cpu", time=False, memory_limit_gb=2.0)
    with pytest.raises(JudgeError) as caught:
        Judge(config).judge(load_task(task), Candidate.from_ref(candidate))
    message = str(caught.value)
    assert "\n" not in message, message
    assert message.startswith("task task's reference does not fit in the CPU workers' "
                              "memory limit of 2.00 GiB (an allocation of 4.00 GiB)"), message
    assert "--device cuda" in message and "--shape" in message, message


def test_the_command_says_so_in_one_line_and_exits_2(tmp_path: Path):
    task, candidate = write_task(tmp_path, BIG)
    proc = subprocess.run(
        [sys.executable, "-m", "cuda_agent", "judge", str(task), str(candidate), "--device",
         "cpu", "--no-time", "--set", "memory_limit_gb=2"],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "does not fit in the CPU workers' memory limit" in lines[0], \
        proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr


def test_a_failed_reference_s_error_ends_with_its_own_words(tmp_path: Path):
    """No interpreter warning of the worker's start-up trails the reason."""
    task, candidate = write_task(tmp_path, 16, forward="x.nope()")
    with pytest.raises(JudgeError) as caught:
        Judge(JudgeConfig(device="cpu", time=False)).judge(load_task(task),
                                                           Candidate.from_ref(candidate))
    message = str(caught.value)
    assert "has no attribute 'nope'" in message and "Warning" not in message, message
