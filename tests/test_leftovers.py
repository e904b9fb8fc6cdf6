"""Folders named by their process's pid are swept once it is gone (leftovers.py), and a
judge sweeps those of judges killed outright."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from cuda_agent import leftovers


def _dead_folder(parent: Path, prefix: str) -> Path:
    """A folder made by a process that was then SIGKILLed (no cleanup ran)."""
    code = (f"from cuda_agent import leftovers; import os, signal; "
            f"print(leftovers.owned_dir({prefix!r}, {str(parent)!r}), flush=True); "
            f"os.kill(os.getpid(), signal.SIGKILL)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    folder = Path(done.stdout.strip())
    assert folder.is_dir() and done.returncode == -9
    (folder / "snapshot.py").write_text("x = 1\n")
    return folder


def _age(folder: Path, seconds: float) -> None:
    past = time.time() - seconds
    os.utime(folder, (past, past))


def test_only_old_folders_of_dead_processes_are_swept(tmp_path: Path):
    dead = _dead_folder(tmp_path, "cuda-agent-judge-")
    young = _dead_folder(tmp_path, "cuda-agent-judge-")
    other = _dead_folder(tmp_path, "other-prefix-")
    live = leftovers.owned_dir("cuda-agent-judge-", tmp_path)
    for folder in (dead, other, live):
        _age(folder, 3600)
    assert leftovers.sweep("cuda-agent-judge-", tmp_path) == 1
    assert not dead.exists()
    assert young.is_dir() and other.is_dir() and live.is_dir()


def test_a_new_judge_sweeps_what_killed_judges_left(tmp_path: Path):
    import tempfile

    from cuda_agent.judge import Judge, JudgeConfig
    from cuda_agent.judge.judge import JUDGE_DIR
    from cuda_agent.judge.runner import WORKER_DIR

    left = [_dead_folder(Path(tempfile.gettempdir()), prefix)
            for prefix in (JUDGE_DIR, WORKER_DIR)]
    for folder in left:
        _age(folder, 3600)
    with Judge(JudgeConfig(device="cpu")):
        assert not any(folder.exists() for folder in left)
