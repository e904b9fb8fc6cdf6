"""Value pretraining: the critic learns the GAE returns of the training trajectories.

    cuda-agent train value --config configs/train/tiny.yaml

Each step the critic scores its batch (no gradient), the episode reward is put on the last
model token (``terminal_rewards``), GAE (``ppo.gamma`` 1.0, ``ppo.lam`` 0.95) over the
model's tokens turns those values into returns, and the critic takes an MSE step towards
them; iterating moves the targets with the critic. The explained variance of the values
before the step is logged per step. The critic is written to ``OUT/critic-value/``.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from cuda_agent.train.batch import Batch, chunks, collate
from cuda_agent.train.config import TrainConfig
from cuda_agent.train.models import ValueModel, load_critic, load_tokenizer
from cuda_agent.train.rft import StageResult, fit, load_samples
from cuda_agent.train.run import seed_everything


def critic_targets(critic: ValueModel, batch: Batch, gamma: float, lam: float
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(values, advantages, returns), each [B, T], from the critic's current values."""
    from cuda_agent.train.rl import masked_gae, terminal_rewards

    with torch.no_grad():
        values = critic(batch.input_ids, batch.attention_mask).float() * batch.mask
    rewards = terminal_rewards(batch.scores, batch.mask)
    advantages, returns = masked_gae(rewards, values, batch.mask, gamma=gamma, lam=lam)
    return values, advantages, returns


def pooled_explained_variance(parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
                              ) -> float:
    """Explained variance over the mask tokens of several (values, returns, mask) parts."""
    from cuda_agent.train.rl import explained_variance

    values = torch.cat([v[m > 0] for v, _, m in parts])
    returns = torch.cat([r[m > 0] for _, r, m in parts])
    return explained_variance(values[None], returns[None], torch.ones_like(values)[None])


def critic_step(critic: ValueModel, optimizer: Any, batches: list[Batch],
                returns: list[torch.Tensor], old_values: list[torch.Tensor],
                config: TrainConfig) -> float:
    """One critic optimiser step over micro-batches; the token-mean loss."""
    from cuda_agent.train.rl import value_loss

    opt, schedule = optimizer
    total_mask = sum(float(b.mask.sum()) for b in batches) or 1.0
    opt.zero_grad(set_to_none=True)
    total = 0.0
    for batch, target, old in zip(batches, returns, old_values, strict=True):
        values = critic(batch.input_ids, batch.attention_mask).float()
        loss = value_loss(values, target, batch.mask, old_values=old,
                          clip=config.ppo.value_clip) * (float(batch.mask.sum()) / total_mask)
        loss.backward()
        total += float(loss.detach())
    torch.nn.utils.clip_grad_norm_([p for p in critic.parameters() if p.requires_grad],
                                   config.optim.grad_clip)
    opt.step()
    schedule.step()
    return total


def train_value(config: TrainConfig) -> StageResult:
    seed_everything(config.optim.seed)
    tokenizer = load_tokenizer(config.model.path)
    critic = load_critic(config.model)
    samples = load_samples(config, tokenizer)

    def step(chosen: list[Any], optimizer: Any, device: torch.device) -> dict[str, float]:
        begin = time.perf_counter()
        batches = [collate(part, tokenizer.pad_token_id, device)
                   for part in chunks(chosen, config.optim.micro_batch_size)]
        targets = [critic_targets(critic, b, config.ppo.gamma, config.ppo.lam)
                   for b in batches]
        ev = pooled_explained_variance([(v, r, b.mask) for (v, _, r), b
                                        in zip(targets, batches, strict=True)])
        loss = critic_step(critic, optimizer, batches, [t[2] for t in targets],
                           [t[0] for t in targets], config)
        tokens = sum(b.tokens for b in batches)
        return {"loss": loss, "explained_variance": ev,
                "reward": float(torch.cat([b.scores for b in batches]).mean()),
                "tokens_per_s": tokens / max(time.perf_counter() - begin, 1e-9)}

    run, steps = fit(config, "value", "critic", critic, config.optim.critic_lr, samples, step)
    final = run.out / "critic-value"
    critic.save(final)
    tokenizer.save_pretrained(final)
    curves = run.finish()
    return StageResult(run.out, steps, final, tuple(run.records()), tuple(curves))
