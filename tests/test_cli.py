"""The installed ``cuda-agent`` command, run as a real subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import write_solution

STAGES = ("tasks", "workspace", "judge", "demo")


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cuda_agent", *args], capture_output=True,
                          text=True, timeout=600)


def test_help_lists_every_stage():
    proc = cli("--help")
    assert proc.returncode == 0
    for stage in STAGES:
        assert stage in proc.stdout
    for sub in ("tasks", "workspace"):
        assert "Stage" in cli(sub, "--help").stdout
    judge_help = " ".join(cli("judge", "--help").stdout.split())
    assert "Stage 3 - judge" in judge_help and "more than 5% faster" in judge_help


def test_tasks_commands(kernelbench: Path, tmp_path: Path):
    listing = cli("tasks", "list", str(kernelbench), "--level", "1")
    assert listing.returncode == 0 and "100 tasks" in listing.stdout
    shown = cli("tasks", "show", f"{kernelbench}::1/19")
    assert "float32[4096, 393216]" in shown.stdout
    bad = tmp_path / "d" / "bad.py"
    bad = bad.parent.with_name("d" * max(1, 90 - len(str(bad)))) / "bad.py"
    bad.parent.mkdir()  # the message is wider than the 80 columns of a pipe
    bad.write_text("def broken(:\n")
    checked = cli("tasks", "check", str(bad), f"{kernelbench}::1/19")
    assert checked.returncode == 1
    assert f"bad {bad}:1: syntax error: invalid syntax" in checked.stdout.splitlines()
    assert "ok L1/19_ReLU" in checked.stdout


@pytest.mark.slow
def test_workspace_init_build_judge_json(tmp_path: Path, scale_add_task: Path):
    root = tmp_path / "ws"
    assert cli("workspace", "init", str(scale_add_task), str(root), "--device", "cpu"
               ).returncode == 0
    write_solution(root)
    built = cli("workspace", "build", str(root), "--json")
    assert built.returncode == 0 and json.loads(built.stdout)["ok"]
    verified = cli("workspace", "verify", str(root))
    assert verified.returncode == 0, verified.stdout + verified.stderr
    profiled = cli("workspace", "profile", str(root), "--set", "time_compile=false",
                   "--set", "time_budget_s=0.3")
    assert profiled.returncode == 0, profiled.stdout + profiled.stderr
    assert "cuda_extension.scale_add" in profiled.stdout
    proc = cli("judge", str(scale_add_task), str(root), "--device", "cpu", "--json",
               "--no-compile", "--set", "time_budget_s=0.5", "--set", "min_runs=3")
    assert proc.returncode == 0, proc.stderr
    record = json.loads(proc.stdout)
    for key in ("task", "device", "compiled", "correct", "reward", "reasons", "runtime_ms",
                "eager_ms", "compile_ms", "speedup_vs_eager", "speedup_vs_compile"):
        assert key in record
    assert record["correct"] and record["reward"] >= 1 and record["compile_ms"] is None


def test_clear_errors(tmp_path: Path, scale_add_task: Path):
    proc = cli("judge", str(tmp_path / "missing.py"), str(tmp_path), "--device", "cpu")
    assert proc.returncode == 2 and "no such file or directory" in proc.stderr
    proc = cli("judge", str(scale_add_task), str(tmp_path), "--device", "cpu")
    assert proc.returncode == 2 and "needs model_new.py" in proc.stderr
    proc = cli("judge", str(scale_add_task), str(tmp_path), "--set", "nope=1")
    assert proc.returncode == 2 and "unknown field" in proc.stderr and "nope" in proc.stderr
    proc = cli("workspace", "build", str(tmp_path))
    assert proc.returncode == 2 and "not a cuda-agent workspace" in proc.stderr
