import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cuda_agent.agent.loop import AgentConfig, run_episode
from cuda_agent.agent.trajectory import (
    Recorder,
    TrajectoryError,
    read_trajectory,
    token_view,
)
from cuda_agent.agent.trajectory_view import render
from cuda_agent.agent.types import Message, PolicyStep, TokenView, Usage
from cuda_agent.cli.main import app
from tests.agent.conftest import ScriptedPolicy, act, call

WRITER = """
import os, sys
from cuda_agent.agent.trajectory import Recorder
from cuda_agent.agent.types import Message
rec = Recorder(sys.argv[1])
rec.episode_start("t", "p", {})
rec.message(Message("user", "hello"))
rec._file.write('{"type": "message", "message": {"role": "assist')
rec._file.flush()
os.kill(os.getpid(), 9)
"""


def test_killed_writer_leaves_complete_lines(tmp_path: Path):
    path = tmp_path / "killed.jsonl"
    done = subprocess.run([sys.executable, "-c", WRITER, str(path)], timeout=60)
    assert done.returncode == -9
    loaded = read_trajectory(path)
    assert [r["type"] for r in loaded.records] == ["episode_start", "message"]
    assert loaded.truncated_line is not None and loaded.truncated_line.startswith('{"type"')
    assert not loaded.complete


def test_malformed_middle_line_is_an_error(tmp_path: Path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"type": "message"}\nnot json\n{"type": "step"}\n')
    with pytest.raises(TrajectoryError, match="line 2"):
        read_trajectory(path)


def test_token_view(tmp_path: Path):
    path = tmp_path / "tokens.jsonl"
    with Recorder(path) as rec:
        view = TokenView((1, 2), (3, 4, 5), (-0.5, -0.1, -0.2), (1, 0, 1))
        rec.step(1, PolicyStep(Message("assistant", "a"), Usage(2, 3), view), 0.1)
        rec.step(2, PolicyStep(Message("assistant", "b")), 0.1)
    steps = list(token_view(read_trajectory(path)))
    assert len(steps) == 1
    assert steps[0].turn == 1 and steps[0].response_ids == (3, 4, 5)
    assert steps[0].loss_mask == (1, 0, 1) and steps[0].logprobs == (-0.5, -0.1, -0.2)


@pytest.fixture
def episode_file(workspace: Path, gelu_task, tmp_path: Path) -> Path:
    policy = ScriptedPolicy([
        act(call("glob", {"pattern": "kernels/*"}), text="Looking around."),
        act(call("read_file", {"path": "nope.cpp"})),
        act(call("submit", {"message": "giving up"})),
    ], usage=Usage(100, 10))
    path = tmp_path / "show.jsonl"
    run_episode(gelu_task, workspace, policy, AgentConfig(final_judge=False), path)
    return path


def test_render(episode_file: Path):
    text = render(read_trajectory(episode_file).records)
    assert "=== episode: task gelu_bias_scale, policy scripted" in text
    assert '>>> glob({"pattern": "kernels/*"})' in text
    assert "[read_file FAILED" in text
    assert "=== end: done after 3 turns, 300 prompt + 30 completion tokens" in text


def test_cli_show(episode_file: Path):
    runner = CliRunner()
    shown = runner.invoke(app, ["trajectories", "show", str(episode_file)])
    assert shown.exit_code == 0, shown.output
    assert "Looking around." in shown.output and "=== end: done" in shown.output
    as_json = runner.invoke(app, ["trajectories", "show", str(episode_file), "--json"])
    assert as_json.exit_code == 0
    assert json.loads(as_json.stdout)[-1]["type"] == "episode_end"
    with episode_file.open("a") as f:
        f.write('{"type": "mess')
    torn = runner.invoke(app, ["trajectories", "show", str(episode_file)])
    assert torn.exit_code == 0 and "last line was cut off" in torn.output
    missing = runner.invoke(app, ["trajectories", "show", str(episode_file.parent / "no.jsonl")])
    assert missing.exit_code == 2


@pytest.mark.parametrize("text", ["hello world\n", '{"name": "not a record"}\n', "",
                                  "\udcff"], ids=["prose", "json", "empty", "binary"])
def test_cli_show_refuses_what_is_not_a_trajectory(tmp_path: Path, text: str):
    path = tmp_path / "other.jsonl"
    path.write_bytes(b"\xff\xfe" if text == "\udcff" else text.encode())
    shown = CliRunner().invoke(app, ["trajectories", "show", str(path)])
    assert shown.exit_code == 2, shown.output
    assert f"{path}: not a trajectory" in " ".join(shown.output.split())
    assert "warning" not in shown.output
