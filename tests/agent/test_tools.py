import os
from pathlib import Path

import pytest

from cuda_agent.agent.tool_specs import SPECS
from cuda_agent.agent.tools import Toolbox, ToolsConfig


@pytest.fixture
def box(workspace: Path) -> Toolbox:
    return Toolbox(workspace, ToolsConfig(output_cap_chars=2000))


def test_specs_are_json_schemas(box: Toolbox):
    names = [s.name for s in box.specs()]
    assert names == ["shell", "read_file", "write_file", "edit_file", "multi_edit", "glob",
                     "grep", "build", "verify", "profile", "submit"]
    for spec in SPECS:
        assert spec.parameters["type"] == "object"
        assert set(spec.parameters["required"]) <= set(spec.parameters["properties"])


@pytest.mark.parametrize("name, arguments, expected", [
    ("read_file", {}, "read_file: missing required argument(s) path"),
    ("read_file", {"path": 3}, "argument 'path' must be a string, got int"),
    ("read_file", {"path": "model.py", "limit": "10"}, "'limit' must be an integer"),
    ("read_file", {"path": "model.py", "lines": 3}, "unknown argument(s) lines"),
    ("edit_file", {"path": "model_new.py", "old": "a", "new": "b", "replace_all": 1},
     "'replace_all' must be a boolean"),
    ("multi_edit", {"path": "model_new.py", "edits": [{"old": "a"}]},
     "missing required argument(s) new in 'edits'[0]"),
    ("build", {"now": True}, "build: unknown argument(s) now; expected no arguments"),
    ("fetch_url", {"url": "http://example.com"}, "unknown tool 'fetch_url'; the tools are: "
     "shell, read_file"),
])
def test_bad_arguments(box: Toolbox, name, arguments, expected):
    result = box.call(name, arguments)
    assert not result.ok
    assert expected in result.output


def test_malformed_json_is_quoted(box: Toolbox):
    result = box.call("write_file", None, raw='{"path": "a.cpp", "content": "x')
    assert not result.ok
    assert "not a valid JSON object" in result.output and '{"path": "a.cpp"' in result.output


@pytest.mark.parametrize("path, expected", [
    ("/etc/passwd", "absolute paths are not allowed"),
    ("../outside.txt", "'..' is not allowed"),
    ("kernels/../../x", "'..' is not allowed"),
    ("model.py", "fixed file"),
    ("binding.cpp", "fixed file"),
    ("binding_registry.h", "fixed file"),
    ("utils/build", "fixed file"),
    ("utils/new_helper", "fixed file"),
    (".cuda-agent/workspace.json", "fixed file"),
])
def test_refused_writes(box: Toolbox, workspace: Path, path, expected):
    before = (workspace / "model.py").read_text()
    result = box.call("write_file", {"path": path, "content": "pwned"})
    assert not result.ok and expected in result.output
    assert (workspace / "model.py").read_text() == before
    assert not (workspace.parent / "outside.txt").exists()


def test_symlink_out_of_workspace(box: Toolbox, workspace: Path, tmp_path: Path):
    secret = tmp_path / "secret.txt"
    secret.write_text("secret")
    os.symlink(secret, workspace / "kernels" / "link.txt")
    os.symlink(tmp_path, workspace / "up")
    for name, args in [("read_file", {"path": "kernels/link.txt"}),
                       ("write_file", {"path": "up/secret.txt", "content": "x"}),
                       ("edit_file", {"path": "kernels/link.txt", "old": "s", "new": "t"})]:
        result = box.call(name, args)
        assert not result.ok and "outside the workspace" in result.output, result.output
    assert secret.read_text() == "secret"
    assert "secret" not in box.call("grep", {"pattern": "secret"}).output.replace(
        "no matches for 'secret'", "")


def test_read_write_edit(box: Toolbox, workspace: Path):
    assert box.call("write_file", {"path": "kernels/a.cpp", "content": "int a = 1;\n"
                                   "int b = 1;\n"}).ok
    read = box.call("read_file", {"path": "kernels/a.cpp"})
    assert read.ok and read.output == "     1\tint a = 1;\n     2\tint b = 1;"
    assert "     2\tint b" in box.call("read_file", {"path": "kernels/a.cpp", "offset": 2}).output
    dup = box.call("edit_file", {"path": "kernels/a.cpp", "old": "= 1", "new": "= 2"})
    assert not dup.ok and "occurs 2 times" in dup.output
    assert box.call("edit_file", {"path": "kernels/a.cpp", "old": "= 1", "new": "= 2",
                                  "replace_all": True}).ok
    assert (workspace / "kernels/a.cpp").read_text() == "int a = 2;\nint b = 2;\n"
    missing = box.call("edit_file", {"path": "kernels/a.cpp", "old": "int c", "new": "x"})
    assert not missing.ok and "not found" in missing.output
    assert "no such file" in box.call("read_file", {"path": "nope.cpp"}).output


def test_multi_edit_is_all_or_nothing(box: Toolbox, workspace: Path):
    path = workspace / "kernels" / "m.cpp"
    path.write_text("alpha beta gamma\n")
    bad = box.call("multi_edit", {"path": "kernels/m.cpp", "edits": [
        {"old": "alpha", "new": "ALPHA"}, {"old": "delta", "new": "DELTA"}]})
    assert not bad.ok and "edit 2" in bad.output and "no edit was applied" in bad.output
    assert path.read_text() == "alpha beta gamma\n"
    good = box.call("multi_edit", {"path": "kernels/m.cpp", "edits": [
        {"old": "alpha", "new": "ALPHA"}, {"old": "ALPHA beta", "new": "A B"}]})
    assert good.ok and path.read_text() == "A B gamma\n"


def test_glob_grep(box: Toolbox):
    listed = box.call("glob", {"pattern": "kernels/*.cpp"}).output.splitlines()
    assert listed == ["kernels/example_axpby.cpp", "kernels/example_axpby_binding.cpp"]
    assert "no files match" in box.call("glob", {"pattern": "*.cu"}).output
    hits = box.call("grep", {"pattern": r"class \w+", "path": "*.py"}).output
    assert "model.py:5: class Model" in hits or "model.py:" in hits
    assert not box.call("grep", {"pattern": "("}).ok
    assert ".cuda-agent" not in box.call("grep", {"pattern": "task"}).output


def test_shell_runs_in_workspace_and_caps_output(box: Toolbox, workspace: Path):
    result = box.call("shell", {"command": "pwd; echo oops >&2; exit 3"})
    assert not result.ok and result.output.startswith("exit code 3")
    assert str(workspace) in result.output and "--- stderr ---\noops" in result.output
    big = box.call("shell", {"command": "yes 0123456789 | head -c 100000"})
    assert big.ok and len(big.output) < 2200 and "characters cut" in big.output


@pytest.mark.serial
def test_shell_timeout(workspace: Path):
    box = Toolbox(workspace, ToolsConfig(shell_timeout_s=0.5))
    result = box.call("shell", {"command": "sleep 5"})
    assert not result.ok and "timeout" in result.output and result.seconds < 4


def test_submit(box: Toolbox):
    result = box.call("submit", {"message": "done"})
    assert result.ok and result.data == {"submitted": True, "message": "done"}


def test_verify_and_profile_time_in_one_process_unless_told(workspace: Path):
    """The agent's own calls time the candidate in one process (judge.config.IN_EPISODE),
    where the final judgement would take 8 on CUDA; settings that name a number win."""
    quick = Toolbox(workspace).judge_config(timed=True)
    assert quick.candidate_processes == 1 and quick.time
    assert quick.candidate_processes_for("cuda") == 1
    told = Toolbox(workspace, ToolsConfig(judge={"candidate_processes": 3, "trials": 2}))
    assert told.judge_config(timed=True).candidate_processes == 3
    assert told.judge_config(timed=True).trials == 2
