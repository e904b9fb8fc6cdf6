"""The installed ``cuda-agent`` command, run as a real subprocess."""

from __future__ import annotations

import json
import os
import signal
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
    try:
        _build_verify_profile_judge(root, scale_add_task)
    finally:  # the shell's calls started the workspace's warm judge: end it with the test
        from cuda_agent.execution.warm_judge import WarmJudge

        found = WarmJudge(root).ping()
        if found:
            os.kill(found["pid"], signal.SIGTERM)


def _build_verify_profile_judge(root: Path, scale_add_task: Path) -> None:
    built = cli("workspace", "build", str(root), "--json")
    assert built.returncode == 0 and json.loads(built.stdout)["ok"]
    verified = cli("workspace", "verify", str(root))
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "7 calls (trials=5 at scale 1" in verified.stdout
    verified = cli("workspace", "verify", str(root), "--json", "--set", "trials=2")
    checked = json.loads(verified.stdout)["correctness"]
    assert (checked["trials"], checked["checked_calls"]) == (2, 4)  # 2 trials + 2 scaled
    profiled = cli("workspace", "profile", str(root), "--set", "time_compile=false",
                   "--set", "time_budget_s=0.3")
    assert profiled.returncode == 0, profiled.stdout + profiled.stderr
    assert "cuda_extension.scale_add" in profiled.stdout
    proc = cli("judge", str(scale_add_task), str(root), "--device", "cpu", "--json",
               "--no-compile", "--set", "time_budget_s=0.5", "--set", "min_runs=3",
               "--trials", "2")
    assert proc.returncode == 0, proc.stderr
    record = json.loads(proc.stdout)
    checked = record["correctness"]
    assert (checked["trials"], checked["checked_calls"]) == (2, 4)
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


# a task that loads but cannot run: inspecting it fails, and the next ones are still checked
UNRUNNABLE = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x


def get_inputs():
    raise RuntimeError("no inputs today")


def get_init_inputs():
    return []
"""


def test_tasks_check_reports_every_task(tmp_path: Path):
    from tests.conftest import SCALE_ADD_TASK

    rows = [json.dumps({"level": 1, "problem_id": 1, "name": "unrunnable", "code": UNRUNNABLE}),
            json.dumps({"level": 1, "problem_id": 2, "name": "scale_add", "code": SCALE_ADD_TASK}),
            "{not json",
            json.dumps({"level": 1, "problem_id": 4, "name": "no_code"}),
            json.dumps({"level": 1, "problem_id": 5, "name": "broken", "code": "def f(:\n"}),
            json.dumps({"level": 1, "problem_id": 6, "name": "again", "code": SCALE_ADD_TASK})]
    source = tmp_path / "tasks.jsonl"
    source.write_text("\n".join(rows) + "\n")
    checked = cli("tasks", "check", str(source))
    assert checked.returncode == 1, checked.stdout + checked.stderr
    lines = checked.stdout.splitlines()
    assert lines[0].startswith(f"bad {source}:1: ") and "no inputs today" in lines[0]
    assert lines[1:] == ["ok L1/scale_add", f"bad {source}:3: invalid JSON: Expecting property "
                         "name enclosed in double quotes",
                         f"bad {source}:4: row has no 'code' field (fields: ['level', 'name', "
                         "'problem_id'])",
                         f"bad {source}:5:1: syntax error: invalid syntax", "ok L1/again",
                         "2 of 6 tasks ok"]


def test_demo_names_an_unknown_example_in_one_line():
    proc = cli("demo", "--example", "nosuch", "--device", "cpu")
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("error: builtin:nosuch: no such example; known: "
                                   "gelu_bias_scale, llama_rmsnorm")
    assert "Traceback" not in proc.stdout + proc.stderr


def test_exit_status_convention(tmp_path: Path, scale_add_task: Path):
    """0 passed, 1 the judge refused the candidate, 2 bad input: the same in every command."""
    root = tmp_path / "ws"
    assert cli("workspace", "init", str(scale_add_task), str(root), "--device", "cpu"
               ).returncode == 0
    # the untouched stub's forward raises NotImplementedError: a reward of -1
    verified = cli("workspace", "verify", str(root))
    assert verified.returncode == 1, verified.stdout + verified.stderr
    assert "NotImplementedError" in verified.stdout
    judged = cli("judge", str(scale_add_task), str(root), "--device", "cpu", "--no-time",
                 "--json")
    assert judged.returncode == 1, judged.stdout + judged.stderr
    assert json.loads(judged.stdout)["reward"] == -1
    replay = tmp_path / "replay.json"
    replay.write_text(json.dumps([{"content": "Nothing to change."}]))
    out = tmp_path / "run"
    optimized = cli("optimize", str(scale_add_task), "--model", f"replay:{replay}",
                    "--device", "cpu", "--out", str(out), "--set", "time=false")
    assert optimized.returncode == 1, optimized.stdout + optimized.stderr
    assert json.loads((out / "judge.json").read_text())["reward"] == -1
    assert not list((out / "result" / "kernels").iterdir())  # the example is not the result
    bad = cli("optimize", str(scale_add_task), "--model", f"replay:{tmp_path / 'none.json'}",
              "--device", "cpu", "--out", str(tmp_path / "run2"))
    assert bad.returncode == 2 and "replay: file not found" in bad.stderr


def test_single_file_compile_error_reaches_the_verdict(tmp_path: Path, scale_add_task: Path):
    """load_inline's error carries the ninja log (command lines first): the verdict quotes the
    compiler's own error line, in the table and in --json, and the command exits 1."""
    from tests.conftest import INLINE_SCALE_ADD

    candidate = tmp_path / "broken.py"
    candidate.write_text(INLINE_SCALE_ADD.replace(
        "auto out = torch::empty_like(x);", "auto out = torch::empty_like(x)\n  int broken = ;"))
    proc = cli("judge", str(scale_add_task), str(candidate), "--device", "cpu", "--no-time",
               "--json")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    record = json.loads(proc.stdout)
    assert record["reward"] == -1 and not record["compiled"]
    [reason] = record["reasons"]
    assert reason.startswith("candidate failed: load: RuntimeError: Error building extension "
                             "'inline_scale_add': main.cpp:6:3: error: expected"), reason
    assert "-isystem" not in reason and len(reason) < 800


def test_readme_says_how_to_reach_the_command_and_what_it_exits_with():
    from cuda_agent.cli import exits

    readme = " ".join((Path(__file__).resolve().parents[1] / "README.md").read_text().split())
    setup = (Path(__file__).resolve().parents[1] / "scripts" / "setup.sh").read_text()
    assert "source .venv/bin/activate" in readme and ".venv/bin/activate" in setup
    for status, meaning in ((exits.DONE, "when it did its job and the candidate it judged "
                             "passed"), (exits.REFUSED, "when the judge refused the candidate"),
                            (exits.BAD_INPUT, "for bad input")):
        assert f"**{status}** {meaning}" in readme


@pytest.mark.parametrize(("args", "said"), [
    (("judge", "--device", "nosuch", "a.py", "b.py"),
     "Invalid value for '--device': 'nosuch' is not one of auto, cpu, cuda"),
    (("judge", "--nosuch", "a.py", "b.py"), "No such option: --nosuch"),
    (("judge", "a.py"), "Missing argument 'candidate'."),
    (("judge", "--trials", "two", "a.py", "b.py"), "Invalid value for '--trials'"),
    (("nosuch",), "No such command 'nosuch'."),
    (("workspace", "init", "builtin:gelu_bias_scale", "ws", "--device", "gpu"),
     "'gpu' is not one of cuda, cpu"),
    (("workspace", "verify", "--nosuch"), "No such option: --nosuch"),
    (("tasks", "list"), "Missing argument 'source'."),
    (("synth", "check", "--device", "tpu", "t.py"), "'tpu' is not one of cpu, cuda"),
    (("optimize", "t.py", "--device", "gpu"), "'gpu' is not one of auto, cpu, cuda"),
    (("trajectories", "show"), "Missing argument 'path'."),
])
def test_usage_errors_are_one_line(args: tuple[str, ...], said: str, tmp_path: Path):
    """An unknown option or command, a missing argument, a value an option does not take:
    one line on standard error naming it and the command's --help, exit status 2."""
    src = Path(__file__).resolve().parents[1] / "src"  # this checkout's, from any folder
    proc = subprocess.run([sys.executable, "-m", "cuda_agent", *args], capture_output=True,
                          text=True, timeout=600, cwd=tmp_path,
                          env=dict(os.environ, PYTHONPATH=str(src)))
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == "" and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    line = proc.stderr.strip()
    assert line.startswith("error: ") and said in line, line
    assert line.endswith("--help')") and "cuda-agent" in line, line
    assert not (tmp_path / "ws").exists()
