"""Value pretraining: the critic learns the GAE returns of the training trajectories.

    cuda-agent train value --config configs/train/tiny.yaml

Every trajectory counts, failures included (``data.value_select`` off): a critic that never
sees a failed episode cannot tell one from a good one. Each step the critic scores its batch
once: the episode reward is put on the last model token (``terminal_rewards``), GAE
(``ppo.gamma`` 1.0, ``ppo.lam`` 0.95) over the model's tokens turns those values (detached)
into returns, and the same forward pass takes the MSE gradient towards them, so a token
costs one forward and one backward pass, as in RFT; iterating moves the targets with the
critic. The explained variance of the values before the step is logged per step. The critic
is written to ``OUT/critic-value/``.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from cuda_agent.train.batch import Batch, chunks, collate
from cuda_agent.train.config import TrainConfig
from cuda_agent.train.guards import check_positions
from cuda_agent.train.models import ValueModel, load_critic, load_tokenizer
from cuda_agent.train.rft import StageResult, fit, load_samples
from cuda_agent.train.run import clip_and_step, seed_everything


def gae_targets(values: torch.Tensor, batch: Batch, gamma: float, lam: float
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, returns), each [B, T], of ``values`` with the episode reward on the
    last model token."""
    from cuda_agent.train.rl import masked_gae, terminal_rewards

    rewards = terminal_rewards(batch.scores, batch.mask)
    return masked_gae(rewards, values.detach() * batch.mask, batch.mask, gamma=gamma, lam=lam)


def critic_targets(critic: ValueModel, batch: Batch, gamma: float, lam: float
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(values, advantages, returns), each [B, T], from the critic's current values."""
    with torch.no_grad():
        values = critic(batch.input_ids, batch.attention_mask).float() * batch.mask
    return (values, *gae_targets(values, batch, gamma, lam))


def pooled_explained_variance(parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
                              ) -> float:
    """Explained variance over the mask tokens of several (values, returns, mask) parts."""
    from cuda_agent.train.rl import explained_variance

    values = torch.cat([v[m > 0] for v, _, m in parts])
    returns = torch.cat([r[m > 0] for _, r, m in parts])
    return explained_variance(values[None], returns[None], torch.ones_like(values)[None])


def critic_step(critic: ValueModel, optimizer: Any, batches: list[Batch],
                returns: list[torch.Tensor], old_values: list[torch.Tensor],
                config: TrainConfig) -> dict[str, float]:
    """One critic optimiser step over micro-batches towards fixed ``returns`` (PPO); the
    token-mean loss and the gradient norm."""
    from cuda_agent.train.rl import value_loss

    opt, _ = optimizer
    total_mask = sum(float(b.mask.sum()) for b in batches) or 1.0
    opt.zero_grad(set_to_none=True)
    total = 0.0
    for batch, target, old in zip(batches, returns, old_values, strict=True):
        values = critic(batch.input_ids, batch.attention_mask).float()
        loss = value_loss(values, target, batch.mask, old_values=old,
                          clip=config.ppo.value_clip) * (float(batch.mask.sum()) / total_mask)
        loss.backward()
        total += float(loss.detach())
    return {"value_loss": total,
            "value_grad_norm": clip_and_step(critic, optimizer, config.optim.grad_clip)}


def pretrain_step(critic: ValueModel, optimizer: Any, batches: list[Batch],
                  config: TrainConfig) -> dict[str, float]:
    """One value-pretraining step: per micro-batch one forward pass gives the values, their
    GAE returns (detached) and the MSE gradient; the step's loss, EV before it, grad norm."""
    from cuda_agent.train.rl import value_loss

    opt, _ = optimizer
    total_mask = sum(float(b.mask.sum()) for b in batches) or 1.0
    opt.zero_grad(set_to_none=True)
    total, parts = 0.0, []
    for batch in batches:
        values = critic(batch.input_ids, batch.attention_mask).float()
        _, returns = gae_targets(values, batch, config.ppo.gamma, config.ppo.lam)
        loss = value_loss(values, returns, batch.mask) * (float(batch.mask.sum()) / total_mask)
        loss.backward()
        total += float(loss.detach())
        parts.append((values.detach() * batch.mask, returns, batch.mask))
    return {"loss": total, "explained_variance": pooled_explained_variance(parts),
            "grad_norm": clip_and_step(critic, optimizer, config.optim.grad_clip)}


def train_value(config: TrainConfig) -> StageResult:
    seed_everything(config.optim.seed)
    tokenizer = load_tokenizer(config.model.path)
    critic = load_critic(config.model)
    check_positions(config, critic.backbone)
    samples = load_samples(config, tokenizer, select=config.data.value_select)

    def step(chosen: list[Any], optimizer: Any, device: torch.device) -> dict[str, float]:
        begin = time.perf_counter()
        batches = [collate(part, tokenizer.pad_token_id, device)
                   for part in chunks(chosen, config.optim.micro_batch_size)]
        metrics = pretrain_step(critic, optimizer, batches, config)
        tokens = sum(b.tokens for b in batches)
        return {**metrics, "reward": float(torch.cat([b.scores for b in batches]).mean()),
                "tokens_per_s": tokens / max(time.perf_counter() - begin, 1e-9)}

    run, steps = fit(config, "value", "critic", critic, config.optim.critic_lr, samples, step)
    final = run.out / "critic-value"
    critic.save(final)
    tokenizer.save_pretrained(final)
    curves = run.finish()
    return StageResult(run.out, steps, final, tuple(run.records()), tuple(curves))
