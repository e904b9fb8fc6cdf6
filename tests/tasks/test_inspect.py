from pathlib import Path

import pytest

from cuda_agent.tasks import TaskError, load_task
from cuda_agent.tasks.inspect import inspect_task

HEAD = "import torch\nimport torch.nn as nn\n"
MODEL = ("class Model(nn.Module):\n    def __init__(self, k=2):\n        super().__init__()\n"
         "        self.k = k\n    def forward(self, x):\n        return x * self.k\n")


def _task(tmp_path: Path, inputs: str, init: str = "[3]", model: str = MODEL):
    path = tmp_path / "t.py"
    path.write_text(f"{HEAD}{model}\ndef get_inputs():\n    {inputs}\n"
                    f"def get_init_inputs():\n    return {init}\n")
    return load_task(path)


def test_shapes_on_meta(tmp_path: Path):
    spec = inspect_task(_task(tmp_path, "return [torch.rand(4096, 4096, 64)]"))
    assert [str(s) for s in spec.inputs] == ["float32[4096, 4096, 64]"]
    assert [str(s) for s in spec.outputs] == ["float32[4096, 4096, 64]"]
    assert spec.init_inputs == "[3]"


def test_kernelbench_problem(kernelbench: Path):
    spec = inspect_task(load_task(f"{kernelbench}::1/40"))
    assert [str(s) for s in spec.inputs] == ["float32[16, 64, 256, 256]"]


@pytest.mark.parametrize(
    ("inputs", "init", "message"),
    [
        ("return [1 / 0]", "[3]", "get_inputs\\(\\) raised ZeroDivisionError"),
        ("return [torch.rand(2), 'text']", "[3]",
         "get_inputs\\(\\) returned a str at position 1; every input must be a torch.Tensor"),
        ("return torch.rand(2)", "[3]", "get_inputs\\(\\) must return a list"),
        ("return [torch.rand(2)]", "[1, 2, 3]", "Model\\(\\*get_init_inputs\\(\\)\\) raised"),
    ],
)
def test_malformed_runtime(tmp_path: Path, inputs: str, init: str, message: str):
    with pytest.raises(TaskError, match=message):
        inspect_task(_task(tmp_path, inputs, init))


def test_import_error(tmp_path: Path):
    path = tmp_path / "t.py"
    path.write_text(f"{HEAD}import no_such_module_xyz\n{MODEL}\ndef get_inputs(): return []\n"
                    "def get_init_inputs(): return []\n")
    with pytest.raises(TaskError, match="importing the task raised ModuleNotFoundError"):
        inspect_task(load_task(path))
