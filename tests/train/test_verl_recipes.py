"""The verl recipes: the trainer-free episode bookkeeping (always), and with verl installed
the configs composed against verl's schema and one episode through ``CudaAgentLoop``.

    .venv/bin/python -m pytest tests/train/test_verl_recipes.py            # part (a)
    .venv-verl/bin/python -m pytest tests/train/test_verl_recipes.py       # (a) and (b)
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cuda_agent.tasks import load_task
from cuda_agent.tasks.loaders import builtin_dir
from cuda_agent.train.episode_state import (
    AgentEpisode,
    ChatCodec,
    EpisodeSettings,
    LocalJudge,
    run_rollout,
)

REPO = Path(__file__).resolve().parents[2]
RECIPES = REPO / "recipes" / "verl"
SOLUTION = builtin_dir() / "gelu_bias_scale" / "solution" / "cpu"
FAST_JUDGE = {"trials": 2, "scales": [], "time": False}


class CharTokenizer:
    """A tokenizer stand-in: one id per character, no chat template (the plain template)."""

    eos_token = None
    chat_template = None

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(i) for i in ids)


def block(name: str, arguments: dict[str, Any]) -> str:
    return f'<tool_call>{json.dumps({"name": name, "arguments": arguments})}</tool_call>'


def solving_replies() -> list[str]:
    writes = [block("write_file", {"path": str(p.relative_to(SOLUTION)),
                                   "content": p.read_text()})
              for p in [*sorted((SOLUTION / "kernels").iterdir()), SOLUTION / "model_new.py"]]
    return ["Reading the task.\n" + block("read_file", {"path": "model.py"}),
            "Writing the kernel.\n" + "\n".join(writes),
            block("verify", {}),
            block("submit", {"message": "fused"}) + "<|end|>"]


class ScriptedGenerator:
    """Stands in for the engine: answers with the scripted texts, encoded; keeps prompts."""

    def __init__(self, tokenizer: CharTokenizer, replies: list[str]):
        self.tokenizer, self.replies = tokenizer, list(replies)
        self.prompts: list[list[int]] = []

    async def __call__(self, ids: list[int]) -> tuple[list[int], list[float]]:
        self.prompts.append(list(ids))
        reply = self.tokenizer.encode(self.replies.pop(0))
        return reply, [-0.5] * len(reply)


def settings() -> EpisodeSettings:
    return EpisodeSettings(device="cpu", judge=FAST_JUDGE, tools={"judge": FAST_JUDGE})


def test_episode_masks_tool_outputs_and_rewards_the_solution():
    tokenizer = CharTokenizer()
    replies = solving_replies()
    generate = ScriptedGenerator(tokenizer, replies)
    codec = ChatCodec(tokenizer)
    with AgentEpisode(load_task("builtin:gelu_bias_scale"), settings(), LocalJudge()) as ep:
        root = ep.root
        assert root is not None and (root / "model.py").is_file()
        rollout = asyncio.run(run_rollout(ep, codec, generate, response_length=1_000_000))
    assert not root.exists()  # the workspace goes with the episode

    assert rollout.stop == "done" and rollout.turns == 4
    assert rollout.verdict.error is None, rollout.verdict.error
    assert rollout.reward >= 1 and rollout.verdict.result["correct"]
    trace = rollout.trace
    assert len(trace.response_ids) == len(trace.response_mask) == len(trace.logprobs)
    # mask 1 spans are exactly the generated replies, in order; the rest is tool output
    spans, start = [], None
    for i, m in enumerate([*trace.response_mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            spans.append(tokenizer.decode(trace.response_ids[start:i]))
            start = None
    assert spans == replies
    text = tokenizer.decode(trace.response_ids)
    observed = [tokenizer.decode(trace.response_ids[i:j]) for i, j in _zero_runs(trace)]
    assert len(observed) == 3 and all("<|tool|>" in o for o in observed)
    assert "reward 1" in observed[2] and "reward 1" in text
    assert all(lp == -0.5 for lp, m in zip(trace.logprobs, trace.response_mask, strict=True) if m)
    # each turn's prompt is exactly the trace so far: one growing sequence
    for prompt, later in zip(generate.prompts, generate.prompts[1:], strict=False):
        assert later[:len(prompt)] == prompt
    assert generate.prompts[0] == trace.prompt_ids


class BrokenJudge:
    def judge(self, task, root, config, failed_reward):
        return LocalJudge().judge(task, root / "missing", config, failed_reward)


def test_nudge_token_limit_and_failed_judge():
    tokenizer = CharTokenizer()
    task = load_task("builtin:gelu_bias_scale")
    generate = ScriptedGenerator(tokenizer, ["thinking", "still thinking", "never asked"])
    with AgentEpisode(task, settings(), BrokenJudge()) as ep:
        rollout = asyncio.run(run_rollout(ep, ChatCodec(tokenizer), generate, 1_000_000))
        # a reply without a call is nudged once; the second in a row ends the episode
        assert rollout.stop == "done" and rollout.turns == 2
        assert "nudge" not in ep.messages[3].content and ep.messages[3].role == "user"
    assert rollout.reward == -1 and rollout.verdict.error  # the judge could not run
    with AgentEpisode(task, settings(), BrokenJudge()) as ep:
        cut = asyncio.run(run_rollout(ep, ChatCodec(tokenizer),
                                      ScriptedGenerator(tokenizer, ["x" * 30]), 20))
    assert cut.stop == "token_limit" and len(cut.trace.response_ids) == 20
    assert cut.trace.response_mask == [1] * 20


def _zero_runs(trace) -> list[tuple[int, int]]:
    runs, start = [], None
    for i, m in enumerate([*trace.response_mask, 1]):
        if not m and start is None:
            start = i
        elif m and start is not None:
            runs.append((start, i))
            start = None
    return runs


# -- the recipes' schedules, read as verl's trainer reads them ----------------------------


def recipe(name: str) -> dict[str, Any]:
    """A PPO recipe over common_ppo.yaml (its defaults entry), merged as Hydra merges."""
    import yaml

    def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
        out = dict(base)
        for key, value in over.items():
            out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(
                out.get(key), dict) else value
        return out

    own = yaml.safe_load((RECIPES / f"{name}.yaml").read_text())
    assert "common_ppo" in own["defaults"], name
    common = yaml.safe_load((RECIPES / "common_ppo.yaml").read_text())
    return merge(common, {k: v for k, v in own.items() if k not in ("hydra", "defaults")})


def actor_updates(trainer: dict[str, Any]) -> int:
    """Actor updates of a run: verl's RayPPOTrainer.fit runs global steps 1 .. total and
    updates the actor at step s when ``critic_warmup <= s`` (the critic at every step)."""
    total, warmup = trainer["total_training_steps"], trainer["critic_warmup"]
    return sum(1 for s in range(1, total + 1) if warmup <= s)


def test_value_pretraining_never_updates_the_actor():
    config = recipe("value_pretrain")
    assert config["trainer"]["total_training_steps"] > 0
    assert actor_updates(config["trainer"]) == 0
    assert actor_updates({**config["trainer"], "total_training_steps": 10_000}) == 0
    assert config["algorithm"] == {"adv_estimator": "gae", "gamma": 1.0, "lam": 0.95,
                                   "use_kl_in_reward": False}
    assert config["critic"]["optim"]["lr"] == 6.0e-6


def test_ppo_recipes_update_the_actor_every_step_with_the_papers_settings():
    for name in ("single_turn_warmup", "ppo"):
        trainer = recipe(name)["trainer"]
        assert actor_updates(trainer) == trainer["total_training_steps"], name
    config = recipe("ppo")
    actor, rollout = config["actor_rollout_ref"]["actor"], config["actor_rollout_ref"]["rollout"]
    assert config["trainer"]["total_training_steps"] == 150
    assert config["data"]["train_batch_size"] == 1024
    assert (actor["optim"]["lr"], config["critic"]["optim"]["lr"]) == (3.0e-6, 6.0e-6)
    assert (actor["clip_ratio_low"], actor["clip_ratio_high"]) == (0.2, 0.28)
    assert actor["loss_agg_mode"] == "token-mean"
    assert (rollout["max_model_len"], rollout["multi_turn"]["max_assistant_turns"]) == (
        131072, 150)
    assert (config["algorithm"]["gamma"], config["algorithm"]["lam"]) == (1.0, 0.95)
    warmup = recipe("single_turn_warmup")["actor_rollout_ref"]["rollout"]
    assert (warmup["max_model_len"], warmup["multi_turn"]["max_assistant_turns"]) == (32768, 1)


# -- (b) with verl installed -------------------------------------------------------------


def test_recipes_compose_against_verl_schema():
    pytest.importorskip("verl")
    done = subprocess.run([sys.executable, str(RECIPES / "validate.py")], capture_output=True,
                          text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    for name in ("single_turn_warmup", "rft", "value_pretrain", "ppo"):
        assert f"OK {name}" in done.stdout, done.stdout


class StubServer:
    """verl's ``LLMServerClient.generate`` as a stub: the same async keyword interface,
    answering with scripted token ids and log-probabilities."""

    def __init__(self, tokenizer: CharTokenizer, replies: list[str]):
        self.generator = ScriptedGenerator(tokenizer, replies)
        self.request_ids: set[str] = set()

    async def generate(self, request_id: str, *, prompt_ids: list[int],
                       sampling_params: dict[str, Any], **_: Any) -> Any:
        from verl.workers.rollout.replica import TokenOutput

        self.request_ids.add(request_id)
        ids, logprobs = await self.generator(prompt_ids)
        return TokenOutput(token_ids=ids, log_probs=logprobs)


def test_agent_loop_runs_one_episode_on_a_stub_server():
    pytest.importorskip("verl")
    from omegaconf import OmegaConf

    from cuda_agent.train.verl_loop import CudaAgentLoop

    entries = OmegaConf.load(RECIPES / "agent_loops.yaml")
    entry = next(e for e in entries if e.name == "cuda_agent")
    trainer = OmegaConf.create({"actor_rollout_ref": {"rollout": {
        "prompt_length": 100_000, "response_length": 1_000_000}}})
    tokenizer = CharTokenizer()
    server = StubServer(tokenizer, solving_replies())
    loop = CudaAgentLoop(
        trainer, server, tokenizer, settings=OmegaConf.create(
            {**OmegaConf.to_container(entry.settings), "device": "cpu", "judge": FAST_JUDGE,
             "tools": {"judge": FAST_JUDGE}}))
    out = asyncio.run(loop.run({"temperature": 1.0}, raw_prompt=[],
                               extra_info={"task": "builtin:gelu_bias_scale"}))
    assert out.reward_score >= 1 and out.extra_fields["correct"]
    assert len(server.request_ids) == 1  # one sticky id per episode
    assert len(out.response_ids) == len(out.response_mask) == len(out.response_logprobs)
    assert set(out.response_mask) == {0, 1}
    tensors = out.as_dict()
    assert tensors["rm_scores"][-1] == out.reward_score
