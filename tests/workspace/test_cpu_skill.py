"""SKILL.md on the CPU says the size the task is judged at, the options utils/* pass
through, how a launcher gets scratch memory, and what a fresh output's first touch costs."""

from __future__ import annotations

from pathlib import Path

from cuda_agent.judge import JudgeConfig
from cuda_agent.judge.cpu_size import workspace_sizing
from cuda_agent.tasks import load_task
from cuda_agent.workspace import init_workspace
from tests.conftest import SCALE_ADD_TASK

BIG_TASK = SCALE_ADD_TASK.replace("N = 100_003\n", "BATCH = 1536\nDIM = 1 << 20\n").replace(
    "torch.randn(N), torch.randn(N)", "torch.randn(BATCH, DIM), torch.randn(BATCH, DIM)")


def skill(folder: Path, code: str) -> str:
    path = folder / "task.py"
    path.write_text(code)
    task = load_task(path)
    config = JudgeConfig(device="cpu", memory_limit_gb=4.0)  # the big task over it anywhere
    root = init_workspace(task, folder / "ws", "cpu",
                          sizing=workspace_sizing(task, "cpu", config))
    return (root / "SKILL.md").read_text()


def test_a_task_over_the_memory_says_the_size_it_is_judged_at(tmp_path: Path):
    text = skill(tmp_path, BIG_TASK)
    assert "input 0: `float32[1536, 1048576]`" in text  # model.py's own size
    assert "**Judged at a reduced size.**" in text and "take 18.00 GiB" in text, text
    assert "**DIM 1048576->2048**" in text and "input 0: `float32[1536, 2048]`" in text
    assert "Write kernels for any size" in text


def test_a_task_that_fits_says_its_memory_and_the_rest_of_the_playbook(tmp_path: Path):
    text = skill(tmp_path, SCALE_ADD_TASK)
    assert "Judged at a reduced size" not in text
    assert "a call's inputs, outputs and weights take 1.1 MiB" in text, text
    for option in ("--set trials=2", "--set cpu_size=reduced", "--set time_budget_s=5",
                   "--json", "extra_cflags"):
        assert option in text, option
    assert "cuda_ext::Tensor stats = cuda_ext::empty({2, rows}" in text  # scratch
    assert "stats.data_ptr<float>()" in text
    assert "first touch" in text and "never zero or fill an output first" in text
