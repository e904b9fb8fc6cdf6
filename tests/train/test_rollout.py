"""Rollouts: K episodes at once, one manifest line each, resumable after a kill."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cuda_agent.agent.loop import AgentConfig
from cuda_agent.agent.policies import make_policy
from cuda_agent.agent.trajectory import read_trajectory
from cuda_agent.tasks import load_task
from cuda_agent.train.rollout import (
    MANIFEST,
    RolloutConfig,
    collect,
    episode_name,
    read_manifest,
)
from tests.train.conftest import GELU

UNJUDGED = AgentConfig(final_judge=False)


def manifest_keys(out: Path) -> list[tuple[str, int]]:
    return sorted((r.task, r.k) for r in read_manifest(out))


def test_collect_is_resumable(tmp_path: Path, short_replay: Path) -> None:
    task = load_task(GELU)
    out = tmp_path / "out"

    def factory(_task):
        return make_policy(f"replay:{short_replay}")

    first = collect([task], factory, out, RolloutConfig(episodes_per_task=1, agent=UNJUDGED))
    assert [(r.task, r.k) for r in first.finished] == [("gelu_bias_scale", 0)]
    # a run killed during episode 1: half a trajectory and a workspace, no manifest line
    (out / "trajectories" / "gelu_bias_scale-1.jsonl").write_text('{"type": "episode_sta')
    (out / "workspaces" / "gelu_bias_scale-1").mkdir()
    with (out / MANIFEST).open("a") as handle:
        handle.write('{"task": "gelu_bias_scale", "k": 1, "rew')  # torn manifest line too
    seen = []
    config = RolloutConfig(episodes_per_task=2, parallel=2, agent=UNJUDGED)
    second = collect([task], factory, out, config, on_start=lambda n, s: seen.append((n, s)))
    assert seen == [(1, 1)] and second.skipped == 1 and second.failed == {}
    assert [r.k for r in second.finished] == [1]
    assert manifest_keys(out) == [("gelu_bias_scale", 0), ("gelu_bias_scale", 1)]
    for record in read_manifest(out):
        traj = read_trajectory(out / record.path)
        assert traj.complete and traj.truncated_line is None
        assert record.stop_reason == "done" and record.reward is None
        assert sum(r["type"] == "episode_start" for r in traj.records) == 1
    third = collect([task], factory, out, config)
    assert third.finished == [] and third.skipped == 2
    assert len(read_manifest(out)) == 2


def test_episode_name_is_a_safe_file_name() -> None:
    assert episode_name("level1/19_ReLU x", 3) == "level1_19_ReLU_x-3"


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cuda_agent", *args], capture_output=True,
                          text=True, timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize("episodes", [1])
def test_cli_rollout_and_rerun(tmp_path: Path, episodes: int) -> None:
    replay = tmp_path / "submit.json"
    replay.write_text(json.dumps([{"role": "assistant", "content": "Submitting as is.",
                                   "tool_calls": [{"id": "s", "name": "submit",
                                                   "arguments": {}}]}]))
    args = (GELU, "--model", f"replay:{replay}", "--out", str(tmp_path / "out"), "--device",
            "cpu", "--episodes-per-task", str(episodes), "--set", "trials=1", "--set",
            "time=false")
    proc = cli("rollout", *args)
    assert proc.returncode == 0, proc.stderr
    lines = (tmp_path / "out" / MANIFEST).read_text().splitlines()
    record = json.loads(lines[0])
    assert len(lines) == 1 and record["stop_reason"] == "done" and record["reward"] == -1
    assert record["path"] == "trajectories/gelu_bias_scale-0.jsonl"
    again = cli("rollout", *args)
    assert again.returncode == 0 and "1 skipped" in again.stdout
    assert len((tmp_path / "out" / MANIFEST).read_text().splitlines()) == 1
    bad = cli("rollout", "builtin:nope", "--model", "replay:builtin", "--out",
              str(tmp_path / "x"), "--device", "cpu")
    assert bad.returncode == 2 and "no such example" in bad.stderr
