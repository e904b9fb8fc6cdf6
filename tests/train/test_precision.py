"""Mixed precision in the trainer (CPU, tiny random GPT-2): with ``dtype: bf16`` the weights
that train stay fp32 and every forward pass computes in bf16; stored bf16 weights lose the
small updates of RL learning rates.

    pytest -q tests/train/test_precision.py
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from cuda_agent.precision import compute_dtype
from cuda_agent.train.config import load_config
from cuda_agent.train.models import load_actor, load_critic, save_actor, token_logprobs
from cuda_agent.train.rft import rft_step
from cuda_agent.train.run import make_optimizer
from cuda_agent.train.samples import Sample
from tests.train.trainer_helpers import build_tiny_model

IDS = [5, 9, 17, 30, 2, 7, 11, 12]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny"))


def bf16_config(model: Path, **model_fields):
    return load_config(data={"model": {"path": str(model), "device": "cpu", "dtype": "bf16",
                                       **model_fields}, "optim": {"lr": 3e-6}})


def share_changed_by_one_step(tiny_model: Path, **model_fields) -> float:
    """One RFT step at the paper's learning rate; the share of the attention and MLP weight
    elements that changed."""
    config = bf16_config(tiny_model, **model_fields)
    actor, _ = load_actor(config.model)
    matrices = {n: p for n, p in actor.named_parameters() if p.dim() == 2 and ".h." in n}
    before = {n: p.detach().clone() for n, p in matrices.items()}
    sample = Sample(tuple(IDS), (0, 0, 0, 1, 1, 1, 1, 1), None, 1.0, "t", "tokens")
    rft_step(actor, make_optimizer(actor, config.optim.lr, config), [sample], 0,
             torch.device("cpu"), config)
    changed = sum(int((p.detach() != before[n]).sum()) for n, p in matrices.items())
    return changed / sum(p.numel() for p in matrices.values())


def test_master_weights_keep_the_updates_that_bf16_weights_lose(tiny_model: Path) -> None:
    assert share_changed_by_one_step(tiny_model) > 0.9
    assert share_changed_by_one_step(tiny_model, master_weights=False) < 0.2


def test_bf16_actor_trains_fp32_weights_computes_in_bf16_and_saves_bf16(tiny_model, tmp_path):
    config = bf16_config(tiny_model)
    actor, tokenizer = load_actor(config.model)
    assert {p.dtype for p in actor.parameters()} == {torch.float32}
    assert compute_dtype(actor) == torch.bfloat16
    seen: list[torch.dtype] = []
    head = actor.get_output_embeddings()
    handle = head.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    ids = torch.tensor([IDS])
    logprobs = token_logprobs(actor, ids, torch.ones_like(ids))
    handle.remove()
    assert seen == [torch.bfloat16] and logprobs.dtype == torch.float32
    fp32, _ = load_actor(load_config(data={"model": {"path": str(tiny_model),
                                                     "device": "cpu"}}).model)
    assert compute_dtype(fp32) is None
    exact = token_logprobs(fp32, ids, torch.ones_like(ids))
    assert 0 < float((logprobs - exact).detach().abs().max()) < 0.1  # bf16 rounding
    save_actor(actor, tokenizer, tmp_path / "out")
    saved = json.loads((tmp_path / "out" / "config.json").read_text())
    assert saved["dtype"] == "bfloat16"


def test_bf16_critic_backbone_fp32_head_outside_autocast(tiny_model: Path) -> None:
    critic = load_critic(bf16_config(tiny_model).model)
    assert {p.dtype for p in critic.parameters()} == {torch.float32}
    ids = torch.tensor([IDS])
    values = critic(ids, torch.ones_like(ids))
    assert values.dtype == torch.float32 and values.shape == (1, len(IDS))


def test_lora_adapters_are_fp32_over_a_bf16_base(tiny_model: Path) -> None:
    actor, _ = load_actor(bf16_config(tiny_model, lora={"r": 4, "alpha": 8}).model)
    trained = {p.dtype for p in actor.parameters() if p.requires_grad}
    frozen = {p.dtype for p in actor.parameters() if not p.requires_grad}
    assert trained == {torch.float32} and frozen == {torch.bfloat16}
    assert compute_dtype(actor) is None
