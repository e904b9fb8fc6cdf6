"""Training with nothing to learn from stops with a clear error and exit 1, not exit 0:
no model token within data.max_len, every episode of a PPO step cut at its token limit,
a step whose gradients are all zero.

    pytest -q tests/train/test_guards.py
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from cuda_agent.cli.main import app
from cuda_agent.train.config import TrainConfigError
from cuda_agent.train.guards import TrainSignalError
from cuda_agent.train.ppo import train_ppo
from cuda_agent.train.rft import train_rft
from tests.agent.conftest import act, call
from tests.train.conftest import Turn
from tests.train.trainer_helpers import build_digit_model, build_tiny_model, tiny_config


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny"))


def solved(make_trajectory) -> Path:
    turns = [Turn(act(call("write_file", {"path": "model_new.py", "content": "x = 1"})),
                  [(True, "wrote model_new.py")]),
             Turn(act(call("submit")), [(True, "submitted")])]
    return make_trajectory(turns, reward=2)


def test_no_model_token_within_max_len_fails(tiny_model, make_trajectory, tmp_path):
    # the prompt (system, task, tool specs) is longer than 64 tokens: nothing to train on
    data = {"trajectories": [str(solved(make_trajectory))], "max_len": 64}
    with pytest.raises(TrainSignalError, match=r"none of the 1 samples has a model token "
                       r"within data.max_len=64 tokens \(the shortest prompt before the "
                       r"model's first token is \d+ tokens\)"):
        train_rft(tiny_config(tiny_model, tmp_path / "out", data=data))
    config = tmp_path / "c.yaml"
    config.write_text(f"model: {{path: {tiny_model}, device: cpu}}\n"
                      f"data: {{trajectories: [{data['trajectories'][0]}], max_len: 64}}\n"
                      f"logging: {{out_dir: {tmp_path / 'cli'}, progress: false}}\n")
    done = CliRunner().invoke(app, ["train", "rft", "--config", str(config)])
    assert done.exit_code == 1 and "nothing to train on" in done.output, done.output


def test_max_len_past_the_models_positions_is_a_config_error(tmp_path):
    model = build_digit_model(tmp_path / "digits")  # 64 positions
    data = {"trajectories": [str(tmp_path / "none.jsonl")], "max_len": 65}
    with pytest.raises(TrainConfigError, match="longer than the model's 64 positions"):
        train_rft(tiny_config(model, tmp_path / "out", data=data))


def test_ppo_step_whose_episodes_all_hit_the_token_limit_fails(tiny_model, tmp_path):
    # the episode's prompt (~4.5k tokens) is over the agent's 1024-token budget
    config = tiny_config(tiny_model, tmp_path / "out", data={"max_len": 1024},
                         ppo={"mode": "single_turn", "steps": 1, "rollouts_per_step": 2,
                              "tasks": ["builtin:gelu_bias_scale"], "device": "cpu",
                              "max_new_tokens": 4,
                              "judge": {"trials": 2, "time": False, "scales": []}})
    with pytest.raises(TrainSignalError, match=r"ppo step 1: all 2 episodes stopped on "
                       r"their token limit \(data.max_len=1024"):
        train_ppo(config)
    assert not (tmp_path / "out" / "actor-ppo").exists()


def test_ppo_step_with_zero_gradients_fails(tmp_path):
    # the rewarded token is the end token, which min_new_tokens forbids: every reward is 0,
    # the fresh critic says 0, so every advantage and every return is 0
    model = build_digit_model(tmp_path / "digits")
    config = tiny_config(model, tmp_path / "out",
                         ppo={"mode": "toy", "steps": 2, "rollouts_per_step": 4},
                         toy={"target": "<|endoftext|>", "new_tokens": 4},
                         optim={"batch_size": 4, "micro_batch_size": 4})
    with pytest.raises(TrainSignalError, match=r"ppo \(actor\) step 1: every gradient of "
                       "the step is zero"):
        train_ppo(config)
    assert not (tmp_path / "out" / "metrics.jsonl").exists()
