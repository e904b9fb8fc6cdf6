"""PPO with a critic and the asymmetric clip: the agentic RL stage (and its warm-up).

    cuda-agent train ppo --config configs/train/qwen-0.5b.yaml

Each of ``ppo.steps`` steps: the current actor collects ``ppo.rollouts_per_step`` episodes
(``ppo.mode``: 'agent' episodes or the 'single_turn' warm-up on ``ppo.tasks``, judged by
the real judge; or the 'toy' task); the log-probabilities under the actor at collection
time are recomputed by one forward pass (``old``), the critic's values give GAE advantages
and returns (reward on the last model token), and ``ppo.ppo_epochs`` passes of mini-batches
(``optim.batch_size``) update the actor with the clipped surrogate (``clip_low`` 0.2 /
``clip_high`` 0.28, plus ``kl_coef`` x KL to the frozen starting model) and the critic with
MSE. For the first ``ppo.critic_warmup_steps`` steps only the critic trains.
"""

from __future__ import annotations

import copy
import time
from typing import Any

import torch
from torch import nn

from cuda_agent.train.batch import Batch, chunks, collate
from cuda_agent.train.collect import Collector, EpisodeCollector, ToyCollector
from cuda_agent.train.config import TrainConfig
from cuda_agent.train.guards import (
    check_gradients,
    check_positions,
    check_tokens,
    check_truncation,
)
from cuda_agent.train.models import ValueModel, load_actor, load_critic, save_actor, token_logprobs
from cuda_agent.train.progress import Progress
from cuda_agent.train.rft import StageResult
from cuda_agent.train.run import Run, clip_and_step, make_optimizer, seed_everything
from cuda_agent.train.value import critic_step, critic_targets, pooled_explained_variance


class Reference:
    """The frozen starting policy for the KL term: the base without adapters (LoRA) or a
    copy of the starting weights."""

    def __init__(self, actor: Any):
        self.actor = actor
        self.copy: nn.Module | None = None
        if not hasattr(actor, "disable_adapter"):
            self.copy = copy.deepcopy(actor).eval().requires_grad_(False)

    def logprobs(self, batch: Batch) -> torch.Tensor:
        with torch.no_grad():
            if self.copy is not None:
                return token_logprobs(self.copy, batch.input_ids, batch.attention_mask)
            with self.actor.disable_adapter():
                return token_logprobs(self.actor, batch.input_ids, batch.attention_mask)


@torch.no_grad()
def prepare(actor: nn.Module, critic: ValueModel, reference: Reference | None,
            batches: list[Batch], config: TrainConfig) -> list[dict[str, torch.Tensor]]:
    """Per micro-batch: old and reference log-probs, values, advantages, returns."""
    from cuda_agent.train.rl import masked_whiten

    parts = []
    for batch in batches:
        old = token_logprobs(actor, batch.input_ids, batch.attention_mask)
        values, advantages, returns = critic_targets(critic, batch, config.ppo.gamma,
                                                     config.ppo.lam)
        parts.append({"old": old, "values": values, "advantages": advantages,
                      "returns": returns, "ref": reference.logprobs(batch)
                      if reference is not None else old})
    if config.ppo.whiten_advantages:  # over all the step's mask tokens
        flat = torch.cat([p["advantages"][b.mask > 0] for p, b in zip(parts, batches,
                                                                       strict=True)])
        whitened = masked_whiten(flat[None], torch.ones_like(flat)[None])[0]
        offset = 0
        for part, batch in zip(parts, batches, strict=True):
            n = int((batch.mask > 0).sum())
            adv = torch.zeros_like(part["advantages"])
            adv[batch.mask > 0] = whitened[offset:offset + n]
            part["advantages"], offset = adv, offset + n
    return parts


def actor_step(actor: nn.Module, optimizer: Any, batches: list[Batch],
               parts: list[dict[str, torch.Tensor]], config: TrainConfig) -> dict[str, float]:
    """One actor optimiser step over micro-batches (token-mean surrogate + KL)."""
    from cuda_agent.train.rl import kl_penalty, ppo_policy_loss

    opt, _ = optimizer
    ppo = config.ppo
    total_mask = sum(float(b.mask.sum()) for b in batches) or 1.0
    opt.zero_grad(set_to_none=True)
    sums = {"policy_loss": 0.0, "kl": 0.0, "clip_fraction": 0.0, "approx_kl": 0.0}
    for batch, part in zip(batches, parts, strict=True):
        weight = float(batch.mask.sum()) / total_mask
        logprobs = token_logprobs(actor, batch.input_ids, batch.attention_mask)
        loss, stats = ppo_policy_loss(logprobs, part["old"], part["advantages"], batch.mask,
                                      clip_low=ppo.clip_low, clip_high=ppo.clip_high)
        kl = kl_penalty(logprobs, part["ref"], batch.mask)
        ((loss + ppo.kl_coef * kl) * weight).backward()
        sums["policy_loss"] += float(loss.detach()) * weight
        sums["kl"] += float(kl.detach()) * weight
        sums["clip_fraction"] += stats["clip_fraction"] * weight
        sums["approx_kl"] += stats["approx_kl"] * weight
    return {**sums, "grad_norm": clip_and_step(actor, optimizer, config.optim.grad_clip)}


def ppo_update(actor: nn.Module, critic: ValueModel, reference: Reference | None,
               samples: list[Any], optimizers: dict[str, Any], config: TrainConfig,
               pad_id: int, train_actor: bool, step: int) -> dict[str, float]:
    """All the updates of one step; averaged metrics. Fails when every update's gradient
    of the actor (or of the critic) was zero."""
    device = next(actor.parameters()).device
    minibatches = chunks(samples, config.optim.batch_size)
    micro = [[collate(m, pad_id, device) for m in chunks(mb, config.optim.micro_batch_size)]
             for mb in minibatches]
    parts = [prepare(actor, critic, reference, batches, config) for batches in micro]
    ev = pooled_explained_variance([(p["values"], p["returns"], b.mask) for batches, ps
                                    in zip(micro, parts, strict=True)
                                    for b, p in zip(batches, ps, strict=True)])
    totals: dict[str, float] = {}
    updates = 0
    norms: dict[str, list[float]] = {"actor": [], "critic": []}
    for _ in range(config.ppo.ppo_epochs):
        for batches, ps in zip(micro, parts, strict=True):
            stats = actor_step(actor, optimizers["actor"], batches, ps, config) \
                if train_actor else {}
            stats.update(critic_step(critic, optimizers["critic"], batches,
                                     [p["returns"] for p in ps], [p["values"] for p in ps],
                                     config))
            norms["actor"] += [stats["grad_norm"]] if train_actor else []
            norms["critic"].append(stats["value_grad_norm"])
            for key, value in stats.items():
                totals[key] = totals.get(key, 0.0) + value
            updates += 1
    check_gradients(norms["actor"], "ppo (actor)", step)
    check_gradients(norms["critic"], "ppo (critic)", step)
    metrics = {k: v / updates for k, v in totals.items()}
    metrics["explained_variance"] = ev
    metrics["tokens"] = float(sum(b.tokens for batches in micro for b in batches))
    if "policy_loss" in metrics:
        metrics["loss"] = metrics["policy_loss"]
    return metrics


def train_ppo(config: TrainConfig) -> StageResult:
    seed_everything(config.optim.seed)
    actor, tokenizer = load_actor(config.model)
    if config.ppo.mode != "toy":  # the toy task's samples are ppo.toy's few tokens
        check_positions(config, actor)
    critic = load_critic(config.model)
    reference = Reference(actor) if config.ppo.kl_coef > 0 else None
    run = Run(config, "ppo")
    collector: Collector = (ToyCollector(config, actor, tokenizer) if config.ppo.mode == "toy"
                      else EpisodeCollector(config, actor, tokenizer, run.out / "rollouts"))
    optimizers = {"actor": make_optimizer(actor, config.optim.lr, config),
                  "critic": make_optimizer(critic, config.optim.critic_lr, config)}
    modules = {"actor": actor, "critic": critic}
    start = run.resume(modules, optimizers)
    steps = config.ppo.steps
    actor.train()
    critic.train()
    with Progress(config, "ppo", steps, start) as progress:
        for step in range(start + 1, steps + 1):
            begin = time.perf_counter()
            samples = collector.collect(step)
            rollout_s = time.perf_counter() - begin
            check_truncation(collector.last_results, config, step)
            check_tokens(samples, f"ppo step {step}", config.data.max_len)
            rewards = [float(s.reward) for s in samples]
            metrics: dict[str, float] = {"reward": sum(rewards) / max(len(rewards), 1),
                                         "episodes": float(len(samples)),
                                         "rollout_s": rollout_s}
            begin = time.perf_counter()  # tokens per second of the update alone
            metrics.update(ppo_update(actor, critic, reference, samples, optimizers, config,
                                      tokenizer.pad_token_id,
                                      step > config.ppo.critic_warmup_steps, step))
            metrics["update_s"] = time.perf_counter() - begin
            metrics["tokens_per_s"] = metrics.pop("tokens") / max(metrics["update_s"], 1e-9)
            run.log(step, metrics, force=step == steps)
            run.maybe_save(step, step == steps, modules, optimizers)
            progress.advance(metrics)
    final = run.out / "actor-ppo"
    critic.save(run.out / "critic-ppo")
    save_actor(actor, tokenizer, final)
    curves = run.finish()
    return StageResult(run.out, steps, final, tuple(run.records()), tuple(curves))
