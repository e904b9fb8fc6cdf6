"""PPO: the toy task's reward curve (a regression test with a fixed seed), and the whole
pipeline on CPU: RFT on the shipped expert replay, value pretraining, one PPO step on a
real task with the real judge.

    pytest -q tests/train/test_trainer_ppo.py            # the toy task (~20 s)
    pytest -q -m slow tests/train/test_trainer_ppo.py    # + the pipeline
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from cuda_agent.cli.main import app
from cuda_agent.train.ppo import train_ppo
from tests.conftest import OptimizeRun
from tests.train.trainer_helpers import build_digit_model, build_tiny_model, tiny_config


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


@pytest.mark.slow
def test_pipeline_rft_value_ppo_on_cpu(tmp_path: Path, builtin_replay_run: OptimizeRun
                                       ) -> None:
    # the expert: the shipped replay's real episode on the built-in example
    assert builtin_replay_run.exit_code == 0, builtin_replay_run.output
    expert = tmp_path / "expert" / "trajectory.jsonl"
    expert.parent.mkdir()
    shutil.copyfile(builtin_replay_run.out / "trajectory.jsonl", expert)
    end = json.loads(expert.read_text().splitlines()[-1])
    assert end["type"] == "episode_end" and end["result"]["reward"] >= 1
    model = build_tiny_model(tmp_path / "model")
    out = tmp_path / "run"
    config = tmp_path / "train.yaml"
    config.write_text(f"""
model: {{path: {model}, device: cpu}}
data: {{trajectories: ["{tmp_path}/expert/*.jsonl"], max_len: 16000}}
optim: {{lr: 1.0e-3, critic_lr: 1.0e-3, batch_size: 1, epochs: 1}}
ppo: {{mode: single_turn, steps: 1, rollouts_per_step: 1, tasks: [builtin:gelu_bias_scale],
      device: cpu, max_new_tokens: 8,
      judge: {{trials: 2, time_compile: false, time_budget_s: 0.3}}}}
logging: {{out_dir: {out}, tensorboard: true, progress: false}}
""")
    runner = CliRunner()
    done = runner.invoke(app, ["train", "rft", "--config", str(config)])
    assert done.exit_code == 0, done.output
    done = runner.invoke(app, ["train", "value", "--config", str(config),
                               "--set", f"model.path={out}/actor-rft"])
    assert done.exit_code == 0, done.output
    done = runner.invoke(app, ["train", "ppo", "--config", str(config),
                               "--set", f"model.path={out}/actor-rft",
                               "--set", f"model.critic_path={out}/critic-value"])
    assert done.exit_code == 0, done.output
    records = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    assert [r["stage"] for r in records] == ["rft", "value", "ppo"]
    ppo = records[-1]
    assert ppo["reward"] == -1 and ppo["episodes"] == 1  # a random model fails the judge
    assert {"loss", "kl", "clip_fraction", "explained_variance"} <= set(ppo)
    for name in ("rft-loss", "value-explained_variance", "ppo-reward"):
        assert (out / f"{name}.png").is_file(), name
    assert list((out / "tensorboard").iterdir())
    rollout = next((out / "rollouts" / "step-000001").iterdir())
    end = json.loads((rollout / "trajectory.jsonl").read_text().splitlines()[-1])
    assert end["type"] == "episode_end" and end["result"]["reward"] == -1


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
