"""On the CPU a task that does not fit the workers' memory is judged at a reduced size: the
same reduced task for reference and candidate, said in the verdict, its own baselines, a
correct candidate passing, a wrong one and one written for the task's own sizes failing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cuda_agent.judge import Candidate, Judge, JudgeConfig
from cuda_agent.judge.cpu_size import judged_task, size_budget
from cuda_agent.judge.measure import baseline_key
from cuda_agent.judge.memory import call_fits, worker_limit
from cuda_agent.judge.plan import JudgeError
from cuda_agent.tasks import load_task
from cuda_agent.workspace import init_workspace
from tests.conftest import SCALE_ADD_MODEL_NEW, SCALE_ADD_TASK, write_solution

BIG_TASK = SCALE_ADD_TASK.replace("N = 100_003\n", "BATCH = 1536\nDIM = 1 << 20\n").replace(
    "torch.randn(N), torch.randn(N)", "torch.randn(BATCH, DIM), torch.randn(BATCH, DIM)")
"""scale_add with two inputs of 6 GiB each (1536 x 2**20 float32): a call of 18 GiB."""
CHECK_ONLY = JudgeConfig(device="cpu", time=False, trials=2, scales=(2.0,), memory_limit_gb=4.0)
"""A limit of its own, so that the big tasks are over it on any machine."""


@pytest.fixture
def big(tmp_path: Path) -> tuple[object, Path]:
    """The 6 GiB task and a workspace holding scale_add's honest solution."""
    path = tmp_path / "big.py"
    path.write_text(BIG_TASK)
    task = load_task(path)
    root = init_workspace(task, tmp_path / "ws", "cpu")
    write_solution(root)
    return task, root


def test_the_budget_comes_from_the_memory_limit_and_the_caps():
    config = JudgeConfig(memory_limit_gb=4.0, cpu_call_mb=64, cpu_call_gflop=2)
    budget = size_budget(config, "cpu")
    assert budget.fit_bytes == call_fits(4 << 30) < (4 << 30) // 4
    assert (budget.cap_bytes, budget.cap_flops, budget.always) == (64 << 20, 2e9, False)
    assert budget.limit_bytes == worker_limit(config, "cpu")
    assert size_budget(config.model_copy(update={"cpu_size": "reduced"}), "cpu").always
    assert size_budget(config.model_copy(update={"cpu_size": "full"}), "cpu") is None
    assert size_budget(config, "cuda") is None


def test_the_size_survives_the_verdict_s_json():
    from cuda_agent.execution.backend import judge_result
    from cuda_agent.results import JudgeResult, SizeChange, to_dict

    result = JudgeResult(task="t", device="cpu", precision="fp32", compiled=True, correct=True,
                         reward=1, reasons=(), runtime_ms=None, eager_ms=None, compile_ms=None,
                         speedup_vs_eager=None, speedup_vs_compile=None,
                         size=(SizeChange("dim", 393216, 3072),))
    assert judge_result(json.loads(json.dumps(to_dict(result)))) == result


@pytest.mark.slow
def test_a_6_gib_task_is_judged_at_a_reduced_size(big: tuple[object, Path]):
    task, root = big
    result = Judge(CHECK_ONLY).judge(task, Candidate.from_ref(root))
    assert result.correct and result.reward == 1, result.reasons
    assert [(c.name, c.full) for c in result.size] == [("DIM", 1 << 20)]
    assert result.size[0].judged < 1 << 20
    note = next(f for f in result.flags if f.startswith("judged at a reduced size: "))
    assert f"DIM {1 << 20}->{result.size[0].judged} (" in note and "18.00 GiB" in note, note
    assert "cpu_size=full" in note

    # a wrong kernel fails at the reduced size, told that it must work at any size
    (root / "model_new.py").write_text(SCALE_ADD_MODEL_NEW.replace("self.alpha)",
                                                                   "self.alpha + 1.0)"))
    wrong = Judge(CHECK_ONLY).judge(task, Candidate.from_ref(root))
    assert not wrong.correct and wrong.reward == -1
    assert any("must work at any size" in r for r in wrong.reasons), wrong.reasons

    # one written for the task's own sizes fails there too, and the verdict says why
    (root / "model_new.py").write_text(SCALE_ADD_MODEL_NEW.replace(
        "x.contiguous(), y.contiguous()", "x.view(1536, 1 << 20), y.view(1536, 1 << 20)"))
    fixed = Judge(CHECK_ONLY).judge(task, Candidate.from_ref(root))
    assert not fixed.correct and fixed.reward == -1
    assert any("candidate failed" in r for r in fixed.reasons), fixed.reasons
    assert any("a candidate must work at any size" in r for r in fixed.reasons)


def test_the_reduced_task_has_baselines_of_its_own(big: tuple[object, Path]):
    task, _ = big
    config = JudgeConfig(device="cpu")
    reduced, sizing = judged_task(task, config, "cpu")
    assert sizing.reduced and reduced.sha256 != task.sha256
    assert baseline_key(task, config, "cpu") == baseline_key(reduced, config, "cpu")
    full = config.model_copy(update={"cpu_size": "full"})
    assert baseline_key(task, full, "cpu") != baseline_key(task, config, "cpu")


def test_full_keeps_the_task_s_size_and_says_how_to_reduce(big: tuple[object, Path]):
    task, root = big
    with pytest.raises(JudgeError) as caught:
        Judge(CHECK_ONLY.model_copy(update={"cpu_size": "full", "memory_limit_gb": 2.0})
              ).judge(task, Candidate.from_ref(root))
    message = str(caught.value)
    assert "\n" not in message and "does not fit" in message, message
    assert "--set cpu_size=reduced" in message


def test_reduced_on_request_shrinks_a_task_that_fits(tmp_path: Path):
    path = tmp_path / "mid.py"
    path.write_text(SCALE_ADD_TASK.replace("N = 100_003", "N = 1 << 22"))
    task = load_task(path)
    config = JudgeConfig(device="cpu", cpu_size="reduced", cpu_call_mb=8)
    assert judged_task(task, JudgeConfig(device="cpu"), "cpu")[0] is task  # 48 MiB fits
    reduced, sizing = judged_task(task, config, "cpu")
    assert [(c.name, c.full, c.judged) for c in sizing.changes] == [("N", 1 << 22, 1 << 19)]
    assert "N = 524288" in reduced.code


@pytest.mark.slow
def test_the_command_says_the_size_in_its_report_and_json(big: tuple[object, Path]):
    task, root = big
    command = [sys.executable, "-m", "cuda_agent", "judge", task.source, str(root),
               "--device", "cpu", "--no-time", "--set", "trials=1", "--set", "scales=[]",
               "--set", "memory_limit_gb=4"]
    shown = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "reduced: DIM 1048576->" in shown.stdout, shown.stdout
    assert "judged at a reduced size: DIM 1048576->" in shown.stdout, shown.stdout
    record = subprocess.run([*command, "--json"], capture_output=True, text=True, timeout=900)
    assert record.returncode == 0, record.stdout + record.stderr
    data = json.loads(record.stdout)
    assert data["size"][0]["name"] == "DIM" and data["size"][0]["full"] == 1 << 20


RELU_KERNEL = '''
#include <cstdint>
extern "C" void relu_launch(const float* x, float* y, int64_t n, int config) {
  (void)config;
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0.f ? x[i] : 0.f;
}
'''
RELU_BINDING = '''
#include "binding_registry.h"
extern "C" void relu_launch(const float* x, float* y, int64_t n, int config);

static cuda_ext::Outputs relu(const cuda_ext::Args& args) {
  const cuda_ext::Tensor& x = args.tensor(0);
  CUDA_EXT_CHECK(x.dtype == cuda_ext::DType::Float32 && x.is_contiguous(), "x: float32");
  cuda_ext::Tensor y = cuda_ext::empty_like(x);
  relu_launch(x.data_ptr<float>(), y.data_ptr<float>(), x.numel(), 0);
  return {y};
}
REGISTER_BINDING(relu, "relu(x) -> max(x, 0)", relu);
'''
RELU_MODEL_NEW = '''
import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def forward(self, x):
        return cuda_extension.relu(x.contiguous())
'''


@pytest.mark.slow
def test_kernelbench_relu_is_judged_at_the_size_its_skill_states(tmp_path: Path,
                                                                 kernelbench: Path):
    """KernelBench 1/19 (a 6 GiB input) in a CPU workspace, as `workspace init` makes it:
    SKILL.md and the verdict name the same reduced size, and an honest kernel passes."""
    from cuda_agent.judge.cpu_size import workspace_sizing

    task = load_task(f"{kernelbench}::1/19")
    root = init_workspace(task, tmp_path / "ws", "cpu",
                          sizing=workspace_sizing(task, "cpu", CHECK_ONLY))
    (root / "kernels" / "relu.cpp").write_text(RELU_KERNEL)
    (root / "kernels" / "relu_binding.cpp").write_text(RELU_BINDING)
    (root / "model_new.py").write_text(RELU_MODEL_NEW)
    result = Judge(CHECK_ONLY).judge(task, Candidate.from_ref(root))
    assert result.correct and result.reward == 1, result.reasons
    said = ", ".join(f"{c.name} {c.full}->{c.judged}" for c in result.size)
    assert said == "batch_size 4096->2048, dim 393216->3072"  # 48 MiB a call: the 64 MiB cap
    assert f"**{said}**" in (root / "SKILL.md").read_text()
