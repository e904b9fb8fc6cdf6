"""Rollouts for PPO with the actor being trained: agent episodes on real tasks (judged by
the real judge) or the toy text task.

    collector = EpisodeCollector(config, actor, tokenizer, out / "rollouts")
    samples = collector.collect(step)      # Samples with their rewards

``InMemoryHFPolicy`` is the ``hf:`` policy on a model already in memory, so every step's
episodes come from the current weights. In single-turn mode (the warm-up) the policy sees
one more instruction (``prompts/single_turn.md``: the whole kernel in one reply) and the
episode has one turn; the reward is still the final judgement's.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Protocol

import torch

from cuda_agent.agent.policies.hf_policy import HFConfig, HFPolicy
from cuda_agent.agent.types import Message, PolicyStep, ToolSpec
from cuda_agent.precision import compute_precision
from cuda_agent.train.config import TrainConfig

PROMPTS = Path(__file__).resolve().parent / "prompts"


class Collector(Protocol):
    """Anything that returns one PPO step's samples (``samples.Sample``); ``last_results``
    holds the step's episode results (``EpisodeResult``; empty for the toy task)."""

    last_results: list[Any]

    def collect(self, step: int) -> list[Any]: ...


class InMemoryHFPolicy(HFPolicy):
    """``HFPolicy`` on an already-loaded model and tokenizer (no folder is read)."""

    def __init__(self, model: Any, tokenizer: Any, config: HFConfig) -> None:
        self.config = config
        self.name = f"hf:{config.path}"
        self._torch = torch
        self.device = next(model.parameters()).device
        self.tokenizer = tokenizer
        self.model = model
        self._steps = 0


class OneShotPolicy:
    """Wraps a policy: the last user message gets the single-turn instruction."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name
        self.instruction = (PROMPTS / "single_turn.md").read_text().strip()

    def step(self, messages: list[Message], tools: list[ToolSpec]) -> PolicyStep:
        shown = list(messages)
        for i in range(len(shown) - 1, -1, -1):
            if shown[i].role == "user":
                shown[i] = dataclasses.replace(
                    shown[i], content=f"{shown[i].content}\n\n{self.instruction}")
                break
        return self.inner.step(shown, tools)


class EpisodeCollector:
    """``ppo.rollouts_per_step`` episodes per step, cycling through ``ppo.tasks``."""

    def __init__(self, config: TrainConfig, actor: Any, tokenizer: Any, out: Path):
        from cuda_agent.judge.judge import resolve_device
        from cuda_agent.tasks import load_task

        if not config.ppo.tasks:
            raise ValueError("ppo.tasks is empty: name the tasks to train on "
                             "(builtin:NAME or PATH[::SELECTOR])")
        self.config, self.actor, self.tokenizer, self.out = config, actor, tokenizer, out
        self.device = resolve_device(config.ppo.device)
        self.tasks = [load_task(ref) for ref in config.ppo.tasks]
        self.last_results: list[Any] = []

    def policy(self) -> Any:
        ppo = self.config.ppo
        hf = HFConfig(path=self.config.model.path, max_new_tokens=ppo.max_new_tokens,
                      temperature=ppo.temperature)
        policy: Any = InMemoryHFPolicy(self.actor, self.tokenizer, hf)
        return OneShotPolicy(policy) if ppo.mode == "single_turn" else policy

    def collect(self, step: int) -> list[Any]:
        from cuda_agent.agent.loop import AgentConfig, run_episode
        from cuda_agent.judge.cpu_size import workspace_sizing
        from cuda_agent.train.samples import SampleError, samples_from_trajectory
        from cuda_agent.workspace import init_workspace

        ppo = self.config.ppo
        agent = AgentConfig(max_turns=1 if ppo.mode == "single_turn" else ppo.max_turns,
                            max_tokens=max(self.config.data.max_len, 1024), judge=ppo.judge)
        samples, self.last_results = [], []
        self.actor.eval()
        for i in range(ppo.rollouts_per_step):
            task = self.tasks[((step - 1) * ppo.rollouts_per_step + i) % len(self.tasks)]
            folder = self.out / f"step-{step:06d}" / f"{i:03d}-{task.name}"
            root = init_workspace(task, folder / "workspace", self.device, force=True,
                                  sizing=workspace_sizing(task, self.device))
            trajectory = folder / "trajectory.jsonl"
            trajectory.unlink(missing_ok=True)
            result = run_episode(task, root, self.policy(), agent, trajectory)
            self.last_results.append(result)
            try:
                samples.append(samples_from_trajectory(trajectory, self.tokenizer,
                                                       max_len=self.config.data.max_len))
            except SampleError:  # the policy failed before writing anything
                continue
        self.actor.train()
        return samples


class ToyCollector:
    """The toy task: sample ``toy.new_tokens`` tokens after ``toy.prompt``; the reward is
    the share of them that are the ``toy.target`` token."""

    def __init__(self, config: TrainConfig, actor: Any, tokenizer: Any):
        self.config, self.actor, self.tokenizer = config, actor, tokenizer
        self.last_results: list[Any] = []
        self.prompt = tokenizer(config.toy.prompt, add_special_tokens=False)["input_ids"]
        target = tokenizer(config.toy.target, add_special_tokens=False)["input_ids"]
        if len(target) != 1 or not self.prompt:
            raise ValueError(f"toy.target must be one token (got {len(target)}) and "
                             "toy.prompt not empty")
        self.target = target[0]

    def collect(self, step: int) -> list[Any]:
        from cuda_agent.train.samples import Sample

        toy, ppo = self.config.toy, self.config.ppo
        device = next(self.actor.parameters()).device
        ids = torch.tensor([self.prompt] * ppo.rollouts_per_step, device=device)  # [N, P]
        self.actor.eval()
        with torch.no_grad(), compute_precision(self.actor):
            out = self.actor.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                      do_sample=True, temperature=ppo.temperature, top_k=0,
                                      top_p=1.0, max_new_tokens=toy.new_tokens,
                                      min_new_tokens=toy.new_tokens,
                                      pad_token_id=self.tokenizer.pad_token_id)
        self.actor.train()
        samples = []
        for row in out.tolist():
            response = row[len(self.prompt):]
            reward = sum(1 for t in response if t == self.target) / max(len(response), 1)
            samples.append(Sample(input_ids=tuple(row),
                                  loss_mask=(0,) * len(self.prompt) + (1,) * len(response),
                                  old_logprobs=None, reward=reward, task="toy", source="toy"))
        return samples
