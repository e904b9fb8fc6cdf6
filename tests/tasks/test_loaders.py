import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cuda_agent.tasks import Precision, TaskError, load_task, load_tasks
from tests.conftest import SCALE_ADD_TASK


def test_py_file(scale_add_task: Path):
    task = load_task(scale_add_task)
    assert task.name == "scale_add"
    assert task.origin == "file"
    assert task.precision is Precision.FP32
    assert "class Model" in task.code
    assert len(task.sha256) == 64


def test_kernelbench_jsonl_and_selectors(kernelbench: Path):
    tasks = list(load_tasks(kernelbench))
    assert len(tasks) == 270
    assert {t.level for t in tasks} == {1, 2, 3, 4}
    relu = load_task(f"{kernelbench}::1/19")
    assert (relu.name, relu.level, relu.problem_id, relu.origin) == ("19_ReLU", 1, 19,
                                                                   "kernelbench")
    assert load_task(f"{kernelbench}::19_ReLU").sha256 == relu.sha256
    assert load_task(f"{kernelbench}::#18").sha256 == relu.sha256
    with pytest.raises(TaskError, match="no task matches selector '9/9'"):
        load_task(f"{kernelbench}::9/9")
    with pytest.raises(TaskError, match="holds 270 tasks; pick one"):
        load_task(kernelbench)


def test_kernelbench_checkout_directory(tmp_path: Path):
    for level, _pid, name in [(1, 2, "2_B"), (1, 10, "10_C"), (2, 1, "1_A")]:
        folder = tmp_path / f"level{level}"
        folder.mkdir(exist_ok=True)
        (folder / f"{name}.py").write_text(SCALE_ADD_TASK)
    tasks = list(load_tasks(tmp_path))
    assert [(t.level, t.problem_id) for t in tasks] == [(1, 2), (1, 10), (2, 1)]
    assert load_task(f"{tmp_path}::1/10").name == "10_C"


def _ops_rows() -> list[dict]:
    return [
        {"ops": ["nn.ReLU", "torch.add"], "data_source": "torch#2", "code": SCALE_ADD_TASK},
        {"ops": ["nn.GELU"], "data_source": "torch#1", "code": SCALE_ADD_TASK},
    ]


def test_ops_jsonl_and_parquet(tmp_path: Path):
    jsonl = tmp_path / "ops.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in _ops_rows()) + "\n")
    parquet = tmp_path / "ops.parquet"
    pq.write_table(pa.Table.from_pylist(_ops_rows()), parquet)
    for source in (jsonl, parquet):
        tasks = list(load_tasks(source))
        assert [t.ops for t in tasks] == [("nn.ReLU", "torch.add"), ("nn.GELU",)]
        assert tasks[0].origin == "synthesized"
        assert tasks[0].metadata["data_source"] == "torch#2"
        assert tasks[0].name.startswith("ops_000000_ReLU_add")


def test_datasets_folder(tmp_path: Path):
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_list(_ops_rows()).save_to_disk(str(tmp_path / "ds"))
    tasks = list(load_tasks(tmp_path / "ds"))
    assert len(tasks) == 2 and tasks[1].ops == ("nn.GELU",)


def test_builtin():
    task = load_task("builtin:gelu_bias_scale")
    assert task.origin == "builtin"
    with pytest.raises(TaskError, match="no such example"):
        load_task("builtin:nope")


def test_precision_override(scale_add_task: Path):
    assert load_task(scale_add_task, precision=Precision.BF16).precision is Precision.BF16


@pytest.mark.parametrize(
    ("code", "message"),
    [
        ("def broken(:\n", r"bad\.py:1: syntax error"),
        ("import torch\ndef get_inputs(): return []\ndef get_init_inputs(): return []\n",
         "no class `Model`"),
        ("class Model:\n    pass\ndef get_inputs(): return []\ndef get_init_inputs(): return []\n",
         "has no `forward` method"),
        ("class Model:\n    def forward(self): pass\ndef get_init_inputs(): return []\n",
         r"no function `get_inputs\(\)`"),
        ("", "task code is empty"),
    ],
)
def test_malformed_static(tmp_path: Path, code: str, message: str):
    path = tmp_path / "bad.py"
    path.write_text(code)
    with pytest.raises(TaskError, match=message):
        load_task(path)


def test_malformed_rows(tmp_path: Path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"level": 1, "problem_id": 1, "name": "x", "code": "x = 1"}\n{oops\n')
    with pytest.raises(TaskError, match=r"bad\.jsonl:1: no class `Model`"):
        list(load_tasks(path))
    path.write_text('{"level": 1}\n')
    with pytest.raises(TaskError, match="row has no 'code' field"):
        list(load_tasks(path))
    path.write_text('{oops\n')
    with pytest.raises(TaskError, match=r"bad\.jsonl:1: invalid JSON"):
        list(load_tasks(path))
    (tmp_path / "x.txt").write_text("")
    with pytest.raises(TaskError, match="unknown task format"):
        list(load_tasks(tmp_path / "x.txt"))
    with pytest.raises(TaskError, match="no such file or directory"):
        list(load_tasks(tmp_path / "missing.py"))
