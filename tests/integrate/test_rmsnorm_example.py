"""Issue 9's second worked example: transformers' LlamaRMSNorm, as the extract step writes it
from a Llama model, is solved by the shipped replay (one fused kernel), and the result goes
back into a tiny Llama model in place of every RMSNorm with the same logits."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from cuda_agent.agent.loop import AgentConfig
from cuda_agent.agent.optimize import optimize
from cuda_agent.agent.policies import make_policy
from cuda_agent.agent.tools import ToolsConfig
from cuda_agent.agent.trajectory import read_trajectory
from cuda_agent.tasks import load_task
from cuda_agent.tasks.loaders import builtin_dir
from tests.conftest import compile_cuda_units

EXAMPLE = builtin_dir() / "llama_rmsnorm"
TASK = EXAMPLE / "model.py"
NORMS = ("model.layers.*.input_layernorm", "model.layers.*.post_attention_layernorm",
         "model.norm")
# correctness only, one trial per shape: the judge's timing is covered elsewhere
QUICK = {"trials": 1, "scales": [], "time": False}


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_replay_writes_the_shipped_solution(device: str):
    messages = json.loads((EXAMPLE / "replay" / f"{device}.json").read_text())
    calls = [c for m in messages for c in m["tool_calls"]]
    written = {c["arguments"]["path"]: c["arguments"]["content"] for c in calls
               if c["name"] == "write_file"}
    solution = EXAMPLE / "solution" / device
    assert written == {str(p.relative_to(solution)): p.read_text()
                       for p in solution.rglob("*") if p.is_file()}
    assert [c["name"] for c in calls][-3:] == ["build", "verify", "submit"]


def _solve(tmp_path: Path, device: str, shapes: tuple[str, ...], task: Path = TASK) -> Path:
    """Run the shipped replay on the task through ``optimize``, the final judgement at
    ``shapes`` (one, or all the task declares); return the OUT folder.

    The replay's own ``verify`` is left out, and on the CPU one shape is judged: each shape
    of each judgement starts two worker processes that import transformers (~5 s of CPU
    each). `cuda-agent optimize` with the whole replay checks every shape."""
    messages = json.loads((EXAMPLE / "replay" / f"{device}.json").read_text())
    for message in messages:
        message["tool_calls"] = [c for c in message["tool_calls"] if c["name"] != "verify"]
    replay = tmp_path / "replay.json"
    replay.write_text(json.dumps([m for m in messages if m["tool_calls"]]))
    out = tmp_path / "run"
    final = {**QUICK, "shape": shapes[0]} if len(shapes) == 1 else QUICK
    config = AgentConfig(tools=ToolsConfig(judge=QUICK), judge=final)
    policy = make_policy(f"replay:{replay}")
    job = optimize(load_task(task), policy, device, out, config)
    judged = json.loads((out / "judge.json").read_text())
    assert judged["correct"] and judged["reward"] >= 1, judged
    assert job.episode.stop_reason == "done", job.episode.error
    builds = [r for r in read_trajectory(out / "trajectory.jsonl").records
              if r["type"] == "tool_result" and r["name"] == "build"]
    assert [b["ok"] for b in builds] == [True]
    assert {s["name"]: s["correct"] for s in judged["shapes"]} == dict.fromkeys(shapes, True)
    for name in ("model_new.py", f"kernels/rms_norm.{'cu' if device == 'cuda' else 'cpp'}",
                 "kernels/rms_norm_binding.cpp"):
        assert (out / "result" / name).read_text() == \
            (EXAMPLE / "solution" / device / name).read_text(), name
    return out


def _tiny_llama(device: str, dtype: torch.dtype):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64, rms_norm_eps=1e-6)
    model = LlamaForCausalLM(config).eval()
    for module in model.modules():
        if type(module).__name__ == "LlamaRMSNorm":  # ones at init: make the weights count
            module.weight.data.normal_(1.0, 0.5)
    return model.to(device=device, dtype=dtype), config


def _put_back(out: Path, device: str, dtype: torch.dtype, atol: float) -> None:
    from cuda_agent.integrate import replace

    model, config = _tiny_llama(device, dtype)
    tokens = torch.randint(0, config.vocab_size, (2, 24), device=device)
    with torch.no_grad():
        expected = model(tokens, use_cache=False).logits
    replaced = 0
    for pattern in NORMS:
        report = replace(model, pattern, out, init_inputs=[config.hidden_size,
                                                           config.rms_norm_eps])
        replaced += len(report.replaced)
    assert replaced == 2 * config.num_hidden_layers + 1
    assert all(type(m).__name__ != "LlamaRMSNorm" for m in model.modules())
    assert model.model.norm.weight.dtype == dtype
    with torch.no_grad():
        got = model(tokens, use_cache=False).logits
    torch.testing.assert_close(got, expected, atol=atol, rtol=atol)


@pytest.mark.slow
def test_cpu_extract_optimize_put_back_and_check_the_whole_llama(tmp_path: Path):
    """Issue 9 end to end on the CPU: a block of a transformers model built from a config
    (random weights) is extracted at two shapes, solved by the scripted policy, put back into
    every layer, and the whole model is checked against the original."""
    from cuda_agent.integrate import check_model, extract
    from tests.integrate.extract_models import tiny_llama

    pattern = "model.layers.*.input_layernorm"
    samples = [torch.randint(0, 100, (2, 8)), torch.randint(0, 100, (2, 24))]
    task = extract("tests.integrate.extract_models:tiny_llama", samples, out=tmp_path / "task",
                   child=pattern)
    assert task.ok and list(task.input_shapes) == ["s0", "s1"] and len(task.matched) == 2
    out = _solve(tmp_path, "cpu", ("s0",), task.task_path)
    model = tiny_llama()
    for module in model.modules():  # ones at init: make the weights count
        if type(module).__name__ == "LlamaRMSNorm":
            module.weight.data.normal_(1.0, 0.5)
    checked = check_model(model, pattern, out, (samples[1],))
    assert checked.correct, checked.reasons
    assert len(checked.replaced.replaced) == 2 and checked.max_abs_error < 1e-4
    assert checked.before.median_ms > 0 and checked.after.median_ms > 0 and checked.speedup
    # a second result's kernels load beside the first in the same process
    from cuda_agent.integrate.load import load_model_new, locate
    from tests.integrate.putback_fixtures import make_result

    gelu = load_model_new(locate(make_result(tmp_path / "gelu")))
    assert hasattr(gelu, "forward") and check_model(model, pattern, out, (samples[0],)).correct
    assert all(type(m).__name__ == "LlamaRMSNorm" for m in model.modules()
               if m.__class__.__module__.startswith("transformers")
               and "RMSNorm" in type(m).__name__)  # the user's model itself is untouched


@pytest.mark.nvcc
def test_cuda_solution_compiles(tmp_path: Path):
    """Compile-only check of the CUDA solution with the project's builder (no GPU needed)."""
    root = tmp_path / "ws"
    shutil.copytree(EXAMPLE / "solution" / "cuda", root)
    units = compile_cuda_units(root)
    assert [u[0] for u in units] == ["kernels/rms_norm.cu", "kernels/rms_norm_binding.cpp"]
    for _, status, obj, log in units:
        assert status in ("compiled", "cached") and obj.exists(), log
        assert "warning" not in log, log


@pytest.mark.gpu
@pytest.mark.slow
def test_cuda_replay_solves_llama_rmsnorm_and_goes_back_into_llama(tmp_path: Path):
    out = _solve(tmp_path, "cuda", ("s0", "s1"))
    _put_back(out, "cuda", torch.float32, atol=1e-4)
    _put_back(out, "cuda", torch.bfloat16, atol=5e-2)
    # both kernels (a warp or a block per row), vector and scalar paths, every dtype
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    from cuda_agent.integrate.load import load_model_new, locate

    model_new = load_model_new(locate(out))
    for hidden in (64, 100, 1001, 2048, 4096, 5120):
        for dtype, tol in ((torch.float32, 1e-5), (torch.float16, 2e-3), (torch.bfloat16, 2e-2)):
            reference = LlamaRMSNorm(hidden, eps=1e-5).to("cuda", dtype)
            reference.weight.data.normal_(1.0, 0.5)
            new = model_new(hidden, 1e-5).to("cuda", dtype)
            new.load_state_dict(reference.state_dict(), strict=True)
            x = torch.randn(3, 37, hidden, device="cuda", dtype=dtype)
            with torch.no_grad():
                torch.testing.assert_close(new(x), reference(x), atol=tol, rtol=tol)
