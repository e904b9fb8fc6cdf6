"""The single-GPU trainer on tiny random models (CPU): config, log-prob alignment, the RFT
loss mask, checkpoint/resume, value pretraining and the CLI.

    pytest -q tests/train/test_trainer.py
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from cuda_agent.cli.main import app
from cuda_agent.train.batch import collate
from cuda_agent.train.config import TrainConfigError, load_config
from cuda_agent.train.models import load_actor, load_critic, token_logprobs
from cuda_agent.train.rft import sft_loss, train_rft
from cuda_agent.train.samples import Sample
from cuda_agent.train.value import train_value
from tests.agent.conftest import act, call
from tests.train.conftest import Turn
from tests.train.trainer_helpers import build_tiny_model, tiny_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "train"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny"))


def sample(ids: list[int], mask: list[int], reward: float = 1.0) -> Sample:
    return Sample(tuple(ids), tuple(mask), None, reward, "t", "tokens")


# --- configuration ----------------------------------------------------------------------


def test_shipped_configs_load() -> None:
    for path in sorted(CONFIGS.glob("*.yaml")):
        config = load_config(path)
        assert Path(config.model.path).is_absolute(), path
    qwen = load_config(CONFIGS / "qwen-0.5b.yaml")
    assert qwen.model.lora is not None and qwen.model.dtype == "bf16"
    assert (qwen.ppo.clip_low, qwen.ppo.clip_high, qwen.ppo.gamma, qwen.ppo.lam) == (
        0.2, 0.28, 1.0, 0.95)


def test_config_errors_name_the_field(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("model: {path: m}\noptim: {lrr: 0.1}\n")
    with pytest.raises(TrainConfigError, match=r"optim\.lrr: unknown field"):
        load_config(path)
    path.write_text("model: {path: m, lora: {r: 0}}\n")
    with pytest.raises(TrainConfigError, match=r"model\.lora\.r"):
        load_config(path)
    path.write_text("optim: {lr: 1}\n")
    with pytest.raises(TrainConfigError, match=r"model: Field required"):
        load_config(path)
    path.write_text("model: {path: m}\n")
    config = load_config(path, ["ppo.kl_coef=0.1", "model.lora.r=4"])
    assert config.ppo.kl_coef == 0.1 and config.model.lora is not None
    assert config.model.path == str(tmp_path / "m")
    with pytest.raises(TrainConfigError, match="not KEY.PATH=VALUE"):
        load_config(path, ["ppo.kl_coef"])
    with pytest.raises(TrainConfigError, match="not found"):
        load_config(tmp_path / "missing.yaml")


# --- the model pieces -------------------------------------------------------------------


def test_token_logprobs_alignment(tiny_model: Path) -> None:
    config = load_config(data={"model": {"path": str(tiny_model), "device": "cpu"}})
    actor, _ = load_actor(config.model)
    ids = torch.tensor([[5, 9, 17, 30, 2, 7], [4, 4, 8, 0, 0, 0]])
    attention = torch.tensor([[1] * 6, [1, 1, 1, 0, 0, 0]])
    got = token_logprobs(actor, ids, attention)
    assert got.shape == (2, 6) and torch.all(got[:, 0] == 0)
    with torch.no_grad():
        logits = actor(input_ids=ids[:1, :4]).logits[0]  # [4, V]
    manual = torch.log_softmax(logits, -1)[torch.arange(3), ids[0, 1:4]]
    torch.testing.assert_close(got[0, 1:4], manual, rtol=1e-5, atol=1e-5)
    critic = load_critic(config.model)
    values = critic(ids, attention)
    assert values.shape == (2, 6) and torch.all(values == 0)  # the head starts at zero


def test_rft_loss_only_on_model_tokens(tiny_model: Path) -> None:
    config = load_config(data={"model": {"path": str(tiny_model), "device": "cpu"}})
    actor, _ = load_actor(config.model)
    prompt, answer, tool = [3, 4, 5, 6], [20, 21, 22], [40, 41]
    mask = [0] * 4 + [1] * 3 + [0] * 2
    base = collate([sample(prompt + answer + tool, mask)], pad_id=0)
    other_tool = collate([sample(prompt + answer + [90, 91], mask)], pad_id=0)
    other_answer = collate([sample(prompt + [20, 99, 22] + tool, mask)], pad_id=0)
    with torch.no_grad():
        loss = sft_loss(actor, base, float(base.mask.sum()))
        assert float(loss) == pytest.approx(float(sft_loss(actor, other_tool, 3.0)))
        assert float(loss) != pytest.approx(float(sft_loss(actor, other_answer, 3.0)))
        manual = -token_logprobs(actor, base.input_ids, base.attention_mask)[0, 4:7].mean()
    assert float(loss) == pytest.approx(float(manual), rel=1e-5)


# --- training stages on hand-made trajectories ------------------------------------------


def expert_trajectories(make_trajectory, count: int = 3) -> list[Path]:
    turns = [Turn(act(call("write_file", {"path": "model_new.py", "content": "x = 1"})),
                  [(True, "wrote model_new.py")]),
             Turn(act(call("submit")), [(True, "submitted")])]
    return [make_trajectory(turns, reward=r) for r in [3, 2, 1][:count]]


def test_rft_checkpoint_and_resume_same_next_loss(tiny_model, make_trajectory, tmp_path):
    paths = [str(p) for p in expert_trajectories(make_trajectory)]
    data = {"trajectories": paths, "max_len": 8192}

    def run(out: str, steps: int, resume: bool = True):
        config = tiny_config(tiny_model, tmp_path / out, data=data,
                             optim={"max_steps": steps, "epochs": 5},
                             checkpoint={"resume": resume})
        return train_rft(config)

    straight = run("straight", 3)
    run("split", 2)
    resumed = run("split", 3)
    losses = [r["loss"] for r in straight.metrics]
    assert len(losses) == 3 and losses[-1] < losses[0]
    assert resumed.metrics[-1]["step"] == 3
    assert resumed.metrics[-1]["loss"] == pytest.approx(losses[-1], rel=1e-6, abs=1e-7)
    checkpoints = sorted((tmp_path / "split" / "checkpoints" / "rft").glob("step-*"))
    assert [c.name for c in checkpoints] == ["step-000001", "step-000002", "step-000003"]
    assert {"weights.pt", "optimizer.pt", "rng.pt", "state.json"} <= {
        p.name for p in checkpoints[-1].iterdir()}
    assert (straight.final / "config.json").is_file()
    assert (tmp_path / "straight" / "rft-loss.png").is_file()


def test_value_pretraining_explained_variance(tiny_model, make_trajectory, tmp_path):
    paths = [str(p) for p in expert_trajectories(make_trajectory)]
    config = tiny_config(tiny_model, tmp_path / "v", data={"trajectories": paths,
                                                           "max_len": 8192},
                         optim={"max_steps": 6, "epochs": 10, "batch_size": 3,
                                "micro_batch_size": 3, "critic_lr": 3e-3})
    result = train_value(config)
    evs = [r["explained_variance"] for r in result.metrics]
    assert len(evs) == 6 and evs[-1] > evs[0]
    assert (result.final / "value_head.pt").is_file()
    assert (tmp_path / "v" / "value-explained_variance.png").is_file()
    records = [json.loads(line) for line in (tmp_path / "v" / "metrics.jsonl").open()]
    assert all(r["stage"] == "value" and "loss" in r for r in records)


def test_value_pretraining_sees_every_outcome(tiny_model, make_trajectory, tmp_path):
    # two failed and two fast episodes: the critic learns from all four (RFT keeps two)
    turns = [Turn(act(call("submit")), [(True, "submitted")])]
    paths = [str(make_trajectory(turns, reward=r)) for r in (-1, -1, 2, 2)]
    optim = {"max_steps": 1, "batch_size": 4, "micro_batch_size": 2}
    config = tiny_config(tiny_model, tmp_path / "v", optim=optim,
                         data={"trajectories": paths, "max_len": 8192})
    assert config.data.select and not config.data.value_select
    assert train_value(config).metrics[0]["reward"] == pytest.approx(0.5)
    only_kept = tiny_config(tiny_model, tmp_path / "s", optim=optim, data={
        "trajectories": paths, "max_len": 8192, "value_select": True})
    assert train_value(only_kept).metrics[0]["reward"] == pytest.approx(2.0)


def test_cli_reports_config_errors(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("model: {path: m}\nppo: {clip_hi: 1}\n")
    done = CliRunner().invoke(app, ["train", "ppo", "--config", str(path)])
    assert done.exit_code == 2 and "ppo.clip_hi: unknown field" in done.output
    done = CliRunner().invoke(app, ["train", "rft", "--config", str(path),
                                    "--set", "ppo={}"])
    assert done.exit_code == 2 and "model folder not found" in done.output
