import ast
import os
import stat
import subprocess
from pathlib import Path

import pytest

from cuda_agent.tasks import load_task
from cuda_agent.workspace import WorkspaceError, init_workspace, read_workspace
from cuda_agent.workspace.stub import render_stub


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_layout(tmp_path: Path, scale_add_task: Path, device: str):
    root = init_workspace(load_task(scale_add_task), tmp_path / "ws", device)
    names = {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}
    suffix = "cu" if device == "cuda" else "cpp"
    assert {"SKILL.md", "model.py", "model_new.py", "binding.cpp", "binding_registry.h",
            f"kernels/example_axpby.{suffix}", "kernels/example_axpby_binding.cpp",
            "utils/build", "utils/verify", "utils/profile",
            ".cuda-agent/workspace.json"} <= names
    skill = (root / "SKILL.md").read_text()
    assert "scale_add" in skill and "float32[100003]" in skill
    assert ("nvcc" in skill) == (device == "cuda")
    assert not os.access(root / "model.py", os.W_OK) or os.geteuid() == 0
    assert not (root / "model.py").stat().st_mode & stat.S_IWUSR
    assert (root / "utils" / "build").stat().st_mode & stat.S_IXUSR
    info = read_workspace(root)
    assert info.device == device and info.task.code == load_task(scale_add_task).code


def test_refuses_non_empty(tmp_path: Path, scale_add_task: Path):
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "x").write_text("")
    with pytest.raises(WorkspaceError, match="not empty"):
        init_workspace(load_task(scale_add_task), tmp_path / "ws", "cpu")
    with pytest.raises(WorkspaceError, match="device must be"):
        init_workspace(load_task(scale_add_task), tmp_path / "other", "tpu")


def test_read_workspace_errors(tmp_path: Path):
    with pytest.raises(WorkspaceError, match="not a cuda-agent workspace"):
        read_workspace(tmp_path)


def test_stub_keeps_constructor_and_helpers(kernelbench: Path):
    task = load_task(f"{kernelbench}::3/10")  # ResNet101: helper classes + _make_layer
    stub = render_stub(task.code, task.name)
    tree = ast.parse(stub)
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    assert "Model" not in classes and "ModelNew" in classes and "Bottleneck" in classes
    methods = {n.name for n in classes["ModelNew"].body if isinstance(n, ast.FunctionDef)}
    assert methods == {"__init__", "_make_layer", "forward"}
    assert "get_inputs" not in stub and "import cuda_extension" in stub


def test_stub_state_dict_matches_reference(kernelbench: Path):
    import torch

    task = load_task(f"{kernelbench}::1/40")
    ref_ns: dict = {}
    exec(task.code, ref_ns)
    stub_ns: dict = {}
    stub = render_stub(task.code, task.name).replace("import cuda_extension", "")
    exec(stub, stub_ns)
    init = ref_ns["get_init_inputs"]()
    with torch.device("meta"):
        ref, new = ref_ns["Model"](*init), stub_ns["ModelNew"](*init)
    assert ref.state_dict().keys() == new.state_dict().keys()


def test_utils_scripts_run_the_package(tmp_path: Path, scale_add_task: Path):
    from tests.conftest import write_solution

    root = init_workspace(load_task(scale_add_task), tmp_path / "ws", "cpu")
    write_solution(root)
    proc = subprocess.run([str(root / "utils" / "build")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "build ok" in proc.stdout
