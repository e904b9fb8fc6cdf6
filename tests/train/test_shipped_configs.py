"""The shipped tiny config as a new user runs it: the commands at the top of
configs/train/tiny.yaml (and in docs/training.md), as written, in a fresh copy of the
repository's layout, with the config file itself (not a copy with other limits).

    pytest -q -m slow tests/train/test_shipped_configs.py
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import OptimizeRun

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "configs" / "train" / "tiny.yaml"
OPTIMIZE = "cuda-agent optimize"


def documented_commands() -> list[str]:
    """The commands of tiny.yaml's header comment, continuations joined."""
    lines = []
    for line in TINY.read_text().splitlines():
        if not line.startswith("#"):
            break
        if line.startswith("#   "):
            lines.append(line[4:].strip())
    text = "\n".join(lines).replace("\\\n", " ")
    return [" ".join(c.split()) for c in text.splitlines() if c.strip()]


def test_the_documented_commands_are_in_the_docs() -> None:
    docs = " ".join((REPO / "docs" / "training.md").read_text().replace("\\\n", " ").split())
    commands = documented_commands()
    assert [c.split()[:3] for c in commands[2:]] == [["cuda-agent", "train", s]
                                                    for s in ("rft", "value", "ppo")]
    for command in commands:
        assert command in docs, command


def run(command: str, clone: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"),
               PATH=f"{clone / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}")
    return subprocess.run(["bash", "-c", command], cwd=clone, env=env, text=True,
                          capture_output=True, check=False, stdin=subprocess.DEVNULL)


@pytest.mark.slow
def test_tiny_config_runs_as_documented(tmp_path: Path, builtin_replay_run: OptimizeRun
                                        ) -> None:
    clone = tmp_path / "clone"
    (clone / "configs" / "train").mkdir(parents=True)
    shutil.copyfile(TINY, clone / "configs" / "train" / "tiny.yaml")
    shutil.copytree(REPO / "benchmarks" / "train", clone / "benchmarks" / "train")
    bin_dir = clone / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    for name, args in (("python", ""), ("cuda-agent", " -m cuda_agent")):
        (bin_dir / name).write_text(f'#!/bin/sh\nexec "{sys.executable}"{args} "$@"\n')
        (bin_dir / name).chmod(0o755)
    commands = documented_commands()
    # the expert's `optimize` is the shared run of the same command (quick judge settings)
    expert = [c for c in commands if c.startswith(OPTIMIZE)]
    assert expert and re.search(r"--out train-runs/expert\b", expert[0])
    assert builtin_replay_run.exit_code == 0, builtin_replay_run.output
    (clone / "train-runs" / "expert").mkdir(parents=True)
    shutil.copyfile(builtin_replay_run.out / "trajectory.jsonl",
                    clone / "train-runs" / "expert" / "trajectory.jsonl")
    for command in commands:
        if command.startswith(OPTIMIZE):
            continue
        done = run(command, clone)
        assert done.returncode == 0, f"{command}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    out = clone / "train-runs" / "tiny"
    records = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    assert [r["stage"] for r in records] == ["rft"] * 2 + ["value"] * 2 + ["ppo"] * 2
    assert all(r["grad_norm"] > 0 for r in records if r["stage"] != "ppo")
    assert all(r["episodes"] == 2 and r["grad_norm"] > 0 for r in records[-2:])
    for step in ("step-000001", "step-000002"):
        for episode in (out / "rollouts" / step).iterdir():
            end = json.loads((episode / "trajectory.jsonl").read_text().splitlines()[-1])
            assert end["result"]["stop_reason"] != "token_limit", episode
    assert (out / "actor-ppo" / "config.json").is_file()
    assert (out / "critic-value" / "value_head.pt").is_file()
    assert {"loss", "kl", "clip_fraction", "explained_variance"} <= set(records[-1])
    for name in ("rft-loss", "value-explained_variance", "ppo-reward"):  # the curves
        assert (out / f"{name}.png").is_file(), name
    assert list((out / "tensorboard").iterdir())
