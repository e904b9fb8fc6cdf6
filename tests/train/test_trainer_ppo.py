"""PPO: the toy task's reward curve (a regression test with a fixed seed), and LoRA, KL and
resuming on it. The whole pipeline on the CPU (RFT on the shipped expert replay, value
pretraining, PPO on a real task with the real judge) runs with the shipped tiny config in
tests/train/test_shipped_configs.py.

    pytest -q tests/train/test_trainer_ppo.py            # the toy task (~20 s)
"""

from __future__ import annotations

from pathlib import Path

import torch

from cuda_agent.train.ppo import train_ppo
from tests.train.trainer_helpers import build_digit_model, tiny_config


def test_toy_ppo_raises_reward(tmp_path: Path) -> None:
    model = build_digit_model(tmp_path / "digits")
    config = tiny_config(model, tmp_path / "out",
                         ppo={"mode": "toy", "steps": 12, "rollouts_per_step": 16,
                              "ppo_epochs": 2, "kl_coef": 0.01},
                         optim={"lr": 3e-3, "critic_lr": 3e-3, "batch_size": 16,
                                "micro_batch_size": 16, "seed": 0},
                         checkpoint={"every": 6})
    result = train_ppo(config)
    rewards = [r["reward"] for r in result.metrics]
    assert len(rewards) == 12
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert first < 0.25 and last > first + 0.25, rewards  # ~0.1 (1 digit in 10) -> ~0.7
    row = result.metrics[-1]
    for key in ("loss", "kl", "clip_fraction", "explained_variance", "tokens_per_s",
                "value_loss"):
        assert key in row, key
    out = tmp_path / "out"
    assert (out / "ppo-reward.png").is_file() and (out / "tensorboard").is_dir() is False
    assert sorted(p.name for p in (out / "checkpoints" / "ppo").iterdir()) == [
        "step-000006", "step-000012"]
    assert (out / "actor-ppo" / "config.json").is_file()
    assert (out / "critic-ppo" / "value_head.pt").is_file()


def test_toy_ppo_with_lora_kl_and_resume(tmp_path: Path) -> None:
    model = build_digit_model(tmp_path / "digits")

    def run(steps: int):
        return train_ppo(tiny_config(
            model, tmp_path / "out", model={"lora": {"r": 4, "alpha": 8}},
            ppo={"mode": "toy", "steps": steps, "rollouts_per_step": 4, "kl_coef": 0.1,
                 "critic_warmup_steps": 1},
            optim={"batch_size": 4, "micro_batch_size": 2}))

    first = run(1)
    assert "kl" not in first.metrics[0]  # critic warm-up: the actor does not train
    second = run(2)
    assert [r["step"] for r in second.metrics] == [1, 2]
    assert second.metrics[-1]["kl"] >= 0
    saved = torch.load(tmp_path / "out" / "checkpoints" / "ppo" / "step-000002" / "weights.pt")
    assert all("lora_" in k for k in saved["actor"])  # only the adapters are saved
    assert any("value_head" in k for k in saved["critic"])
    assert (tmp_path / "out" / "actor-ppo" / "model.safetensors").is_file()  # merged
