"""`cuda-agent optimize`, the main job: the shipped replay writes, breaks, fixes and speeds up
the built-in example's kernel on the CPU, and the result folder holds what it promises."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cuda_agent.agent.trajectory import read_trajectory
from cuda_agent.cli.main import app
from cuda_agent.tasks.loaders import builtin_dir
from tests.conftest import OptimizeRun

runner = CliRunner()


@pytest.mark.slow
def test_optimize_builtin_replay_end_to_end(builtin_replay_run: OptimizeRun):
    out = builtin_replay_run.out  # the README's quick start, quick judge settings
    assert builtin_replay_run.exit_code == 0, builtin_replay_run.output
    judged = json.loads((out / "judge.json").read_text())
    assert judged["correct"] and judged["reward"] >= 1, judged
    assert (out / "result" / "model_new.py").read_text().count("cuda_extension") >= 1
    assert "#pragma omp parallel" in (out / "result/kernels/gelu_bias_scale.cpp").read_text()
    report = (out / "report.md").read_text()
    assert "reward: **" in report and "kernels/gelu_bias_scale.cpp" in report
    trajectory = read_trajectory(out / "trajectory.jsonl")
    records = trajectory.records
    timed = [r for r in records if r["type"] == "tool_result"]
    rows = [line for line in report.splitlines() if line.startswith("| ")
            and line.split("|")[2].strip() in {r["name"] for r in timed}]
    assert len(rows) == len(timed)  # every tool call's time, in the report
    assert [float(r.split("|")[4]) for r in rows] == [round(r["seconds"], 2) for r in timed]
    judged = [r for r in timed if r["name"] in ("verify", "profile")]
    judged_rows = [r for r in rows if r.split("|")[2].strip() in ("verify", "profile")]
    for row, record in zip(judged_rows, judged, strict=True):  # its longest phase first
        own = {k: v for k, v in record["data"]["phases"] if "." not in k
               and not k.startswith("gpu_")}
        longest = max(own, key=own.get)
        assert row.split("|")[5].strip().startswith(f"{longest} "), (row, own)
    builds = [r for r in records if r["type"] == "tool_result" and r["name"] == "build"]
    assert [b["ok"] for b in builds] == [False, True, True]  # broken, fixed, sped up
    assert "gelu_bias_scale.cpp:" in builds[0]["output"]  # the error names file and line
    assert records[-1]["type"] == "episode_end"
    assert records[-1]["result"]["stop_reason"] == "done"


def test_builtin_replay_refuses_other_tasks(tmp_path: Path, scale_add_task: Path):
    done = runner.invoke(app, ["optimize", str(scale_add_task), "--device", "cpu",
                               "--out", str(tmp_path / "run")])
    assert done.exit_code == 2
    assert "built-in replay solves builtin:gelu_bias_scale only" in done.output


def test_optimize_refuses_a_used_folder_and_a_bad_model(tmp_path: Path):
    used = tmp_path / "used"
    used.mkdir()
    (used / "keep.txt").write_text("mine")
    done = runner.invoke(app, ["optimize", "--device", "cpu", "--out", str(used)])
    assert done.exit_code == 2 and "not empty" in done.output
    assert (used / "keep.txt").read_text() == "mine"
    done = runner.invoke(app, ["optimize", "--device", "cpu", "--model", "gpt:x",
                               "--out", str(tmp_path / "run")])
    assert done.exit_code == 2 and "accepted forms" in done.output


# what a replay cannot know when it speaks: its messages were written before the tool
# results they come after, so a figure or a verdict in them may be contradicted by the run
OUTCOMES = re.compile(r"\b(slower|faster|correct|still correct|it builds|\d+(\.\d+)?\s*(x|ms))\b",
                      re.IGNORECASE)


@pytest.mark.parametrize("replay", sorted(builtin_dir().glob("*/replay/*.json")),
                         ids=lambda p: f"{p.parts[-3]}-{p.stem}")
def test_shipped_replays_state_no_outcome(replay: Path):
    said = [m["content"] for m in json.loads(replay.read_text()) if m.get("content")]
    assert said
    claims = [text for text in said if OUTCOMES.search(text)]
    assert not claims, claims
