"""The large CPU fixture (``fixtures/big_cpu``: about a second a call on a 2-core machine)
verified as the agent's own verify call is: in one process, its checks bounded in time."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from cuda_agent.judge import Candidate, Judge, JudgeConfig
from cuda_agent.judge.config import in_episode
from cuda_agent.tasks import load_task
from cuda_agent.workspace import init_workspace

FIXTURE = Path(__file__).resolve().with_name("fixtures") / "big_cpu"


def big_workspace(folder: Path) -> tuple[object, Path]:
    """The fixture's task and a CPU workspace holding its honest solution."""
    task = load_task(FIXTURE / "task.py")
    root = init_workspace(task, folder, "cpu")
    for example in root.glob("kernels/example_*"):
        example.unlink()
    shutil.copytree(FIXTURE / "solution", root, dirs_exist_ok=True)
    return task, root


@pytest.mark.slow
def test_the_honest_solution_passes_with_fewer_checked_calls(tmp_path: Path):
    """Over the check budget (set low, so that a faster machine is over it too): one call at
    scale 1 with its float64 twin and one scaled call, and the honest kernel, whose
    elements stray from eager's by more than atol, passes on the twinned call's slack."""
    task, root = big_workspace(tmp_path / "ws")
    config = in_episode(JudgeConfig(device="cpu", time=False, check_budget_s=0.5))
    result = Judge(config).judge(task, Candidate.from_ref(root))
    assert result.correct, result.reasons
    assert (result.correctness.trials, result.correctness.checked_calls) == (5, 2)
    assert any("check_budget_s" in flag for flag in result.flags), result.flags
