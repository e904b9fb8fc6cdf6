"""The template's worked example (``example_axpby``) leaves a result only when unused."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from cuda_agent.agent.optimize import copy_result
from cuda_agent.paths import TEMPLATES
from cuda_agent.workspace.examples import example_files, unused_example_files
from tests.conftest import SCALE_ADD_BINDING, SCALE_ADD_KERNEL, SCALE_ADD_MODEL_NEW


def _workspace(root: Path, device: str = "cpu") -> Path:
    shutil.copytree(TEMPLATES / device / "kernels", root / "kernels")
    (root / "kernels" / "scale_add.cpp").write_text(SCALE_ADD_KERNEL)
    (root / "kernels" / "scale_add_binding.cpp").write_text(SCALE_ADD_BINDING)
    (root / "model_new.py").write_text(SCALE_ADD_MODEL_NEW)
    return root


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_unused_example_is_left_out_of_the_result(tmp_path: Path, device: str):
    root = _workspace(tmp_path / "ws", device)
    assert len(example_files(root / "kernels")) == 2
    assert unused_example_files(root / "model_new.py", root / "kernels") == \
        example_files(root / "kernels")
    copy_result(root, tmp_path / "result")
    assert sorted(p.name for p in (tmp_path / "result" / "kernels").iterdir()) == [
        "scale_add.cpp", "scale_add_binding.cpp"]


def test_used_example_stays(tmp_path: Path):
    root = _workspace(tmp_path / "ws")
    (root / "model_new.py").write_text(SCALE_ADD_MODEL_NEW.replace(
        "cuda_extension.scale_add(", "cuda_extension.example_axpby(").replace(
        "self.alpha)", "self.alpha, 1.0)"))
    assert unused_example_files(root / "model_new.py", root / "kernels") == []
    # another binding calling the example's launcher uses it too
    (root / "model_new.py").write_text(SCALE_ADD_MODEL_NEW)
    (root / "kernels" / "scale_add_binding.cpp").write_text(
        SCALE_ADD_BINDING + '\nextern "C" void example_axpby_launch(const float*, '
        "const float*, float*, int64_t, float, float, int);\n")
    assert unused_example_files(root / "model_new.py", root / "kernels") == []
    copy_result(root, tmp_path / "result")
    assert (tmp_path / "result" / "kernels" / "example_axpby.cpp").is_file()
