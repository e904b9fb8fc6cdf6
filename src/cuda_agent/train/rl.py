"""Token-level RL math for multi-turn agent episodes: pure torch, no state.

Every tensor is ``[B, T]`` (batch, token) unless noted. ``mask`` is 1.0 on tokens the
policy generated (assistant text and tool calls) and 0.0 on everything else (prompt,
tool outputs, template scaffolding, padding). Advantages, returns and losses only ever
look at ``mask == 1`` positions, so a tool-output span between two assistant turns is
skipped: GAE links each policy token to the *next policy token*, not to the next token.

Formulas are in docs/training.md ("The RL math").
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = [
    "explained_variance",
    "discounted_suffix_sum",
    "kl_penalty",
    "masked_gae",
    "masked_mean",
    "masked_whiten",
    "ppo_policy_loss",
    "terminal_rewards",
    "value_loss",
]


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``x`` over ``mask == 1`` (all tokens of the batch pooled); 0 if none.

    Values under mask 0 never leak in, even inf or NaN (e.g. log-probs of padding)."""
    keep = mask > 0
    total = torch.where(keep, x, torch.zeros_like(x)).sum()
    return total / keep.sum().clamp(min=1).to(x.dtype)


def masked_whiten(x: Tensor, mask: Tensor, shift_mean: bool = True, eps: float = 1e-8) -> Tensor:
    """Normalise ``x`` to zero mean / unit variance over ``mask``; zeros where mask == 0.

    With fewer than two masked tokens the variance is undefined: ``x - mean`` is returned
    (masked), never NaN.
    """
    m = mask.to(x.dtype)
    n = m.sum()
    mean = masked_mean(x, m)
    centred = torch.where(mask > 0, x - mean, torch.zeros_like(x))
    if n < 2:
        return centred if shift_mean else torch.where(mask > 0, x, torch.zeros_like(x))
    var = (centred**2).sum() / (n - 1)
    scaled = centred * torch.rsqrt(var + eps)
    if not shift_mean:
        scaled = scaled + mean
    return scaled * m


def terminal_rewards(scores: Tensor, mask: Tensor) -> Tensor:
    """Place each episode's score ``[B]`` on its last ``mask == 1`` token -> ``[B, T]``.

    Rows with no policy token get all zeros (the score has nowhere to go).
    """
    B, T = mask.shape
    dtype = scores.dtype if scores.is_floating_point() else torch.float32
    out = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    positions = torch.arange(T, device=mask.device).expand(B, T)
    marked = torch.where(mask > 0, positions, torch.full_like(positions, -1))
    last = marked.max(dim=1).values  # [B]; -1 where the row has no policy token
    rows = torch.nonzero(last >= 0, as_tuple=True)[0]
    out[rows, last[rows]] = scores.to(out.dtype)[rows]
    return out


def masked_gae(
    rewards: Tensor, values: Tensor, mask: Tensor, gamma: float = 1.0, lam: float = 0.95
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation over policy tokens only.

    For policy tokens t_1 < t_2 < ... < t_n of a row (mask == 1):
        delta_i = r_{t_i} + gamma * V_{t_{i+1}} - V_{t_i}      (V_{t_{n+1}} = 0)
        A_i     = delta_i + gamma * lam * A_{i+1}               (A_{n+1} = 0)
        R_i     = A_i + V_{t_i}
    Rewards on masked-out positions are ignored. Returns ``(advantages, returns)``, both
    ``[B, T]`` with zeros where mask == 0. Computed without gradient, with no loop over
    tokens: each row's policy tokens are packed to the front (a stable sort keeps their
    order), the deltas are taken there, and A is their discounted sum from the right.
    """
    with torch.no_grad():
        keep = mask > 0
        m = keep.to(values.dtype)
        order = torch.argsort((~keep).to(torch.int8), dim=1, stable=True)  # [B, T]
        packed_m = m.gather(1, order)
        packed_v = torch.where(keep, values.detach(), 0.0).gather(1, order)
        packed_r = torch.where(keep, rewards.to(values.dtype), 0.0).gather(1, order)
        next_v = torch.nn.functional.pad(packed_v[:, 1:], (0, 1))  # 0 after the last
        delta = (packed_r + gamma * next_v - packed_v) * packed_m
        packed_adv = discounted_suffix_sum(delta, gamma * lam) * packed_m
        adv = torch.zeros_like(packed_adv).scatter(1, order, packed_adv)
        returns = (adv + torch.where(keep, values.detach(), 0.0)) * m
    return adv, returns


def discounted_suffix_sum(x: Tensor, c: float, block: int = 128) -> Tensor:
    """``y[:, i] = sum_{j >= i} c^(j - i) x[:, j]`` over the last dimension of ``[B, N]``.

    Blocks of ``block`` tokens are summed by one matrix product each; the sum carried in
    from the next block is the same recurrence on the blocks' first entries with factor
    ``c^block``, solved the same way, so the work is a few matmuls, not N steps."""
    B, N = x.shape
    powers = c ** torch.arange(block, dtype=x.dtype, device=x.device)  # c^0 .. c^(K-1)
    powers = powers.masked_fill(powers < 1e-30, 0.0)  # no subnormals: they are slow on CPUs
    if block >= N:
        offsets = torch.arange(N, device=x.device)
        gap = offsets[None, :] - offsets[:, None]  # [i, j] = j - i
        weights = torch.where(gap >= 0, powers[:N][gap.clamp(min=0)], 0.0)
        return x @ weights.T
    blocks = -(-N // block)
    padded = torch.nn.functional.pad(x, (0, blocks * block - N)).view(B, blocks, block)
    local = discounted_suffix_sum(padded.reshape(B * blocks, block), c, block)
    local = local.view(B, blocks, block)
    starts = discounted_suffix_sum(local[:, :, 0], c ** block, block)  # [B, blocks]
    carried = torch.nn.functional.pad(starts[:, 1:], (0, 1))  # the next block's start
    tail = c * powers.flip(0)  # c^(K - i) for i = 0 .. K-1
    out = local + tail[None, None, :] * carried[:, :, None]
    return out.reshape(B, blocks * block)[:, :N]


def ppo_policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
) -> tuple[Tensor, dict[str, float]]:
    """Asymmetric clipped surrogate, token-mean over ``mask``.

    ratio = exp(logprobs - old_logprobs); loss = -min(ratio * A, clip(ratio, 1-clip_low,
    1+clip_high) * A). Stats: ``clip_fraction`` (tokens where the clipped branch is taken),
    ``approx_kl`` (mean of 0.5 * (log ratio)^2), ``ratio_mean``.
    """
    m = mask.to(logprobs.dtype)
    log_ratio = torch.where(mask > 0, logprobs - old_logprobs.detach(), 0.0)
    ratio = torch.exp(log_ratio)
    adv = advantages.detach()
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
    surrogate = torch.minimum(unclipped, clipped)
    loss = -masked_mean(surrogate, m)
    with torch.no_grad():
        was_clipped = (clipped < unclipped).to(m.dtype)
        stats = {
            "clip_fraction": float(masked_mean(was_clipped, m)),
            "approx_kl": float(masked_mean(0.5 * log_ratio**2, m)),
            "ratio_mean": float(masked_mean(ratio, m)) if m.sum() > 0 else 1.0,
        }
    return loss, stats


def value_loss(
    values: Tensor,
    returns: Tensor,
    mask: Tensor,
    old_values: Tensor | None = None,
    clip: float | None = None,
) -> Tensor:
    """0.5 * (V - R)^2, token-mean over ``mask``.

    With ``old_values`` and ``clip``: V is also clipped to ``old_values +- clip`` and the
    larger of the two squared errors is taken per token (PPO-style value clipping).
    """
    target = returns.detach()
    err = (values - target) ** 2
    if old_values is not None and clip is not None:
        old = old_values.detach()
        v_clipped = old + torch.clamp(values - old, -clip, clip)
        err = torch.maximum(err, (v_clipped - target) ** 2)
    return 0.5 * masked_mean(err, mask)


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor, kind: str = "k3") -> Tensor:
    """Estimate of KL(policy || reference) from sampled tokens, token-mean over ``mask``.

    kinds (with d = ref_logprobs - logprobs): ``k1`` = -d, ``k2`` = 0.5 * d^2,
    ``k3`` = exp(d) - 1 - d (unbiased, always >= 0).
    """
    d = torch.where(mask > 0, ref_logprobs.detach() - logprobs, 0.0)
    if kind == "k1":
        per_token = -d
    elif kind == "k2":
        per_token = 0.5 * d**2
    elif kind == "k3":
        d = torch.clamp(d, -20.0, 20.0)
        per_token = torch.exp(d) - 1.0 - d
    else:
        raise ValueError(f"unknown KL estimator {kind!r}; expected 'k1', 'k2' or 'k3'")
    return masked_mean(per_token, mask)


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> float:
    """1 - Var[R - V] / Var[R] over ``mask``.

    NaN-safe: returns 0.0 when it is undefined (fewer than 2 masked tokens, Var[R] == 0,
    or non-finite inputs), so it can be averaged and logged without poisoning a run.
    """
    m = mask.to(torch.float64)
    n = float(m.sum())
    if n < 2:
        return 0.0
    v = values.detach().to(torch.float64)
    r = returns.detach().to(torch.float64)

    def var(x: Tensor) -> float:
        mu = (x * m).sum() / n
        return float((((x - mu) * m) ** 2).sum() / (n - 1))

    var_r = var(r)
    if var_r <= 0.0 or not math.isfinite(var_r):
        return 0.0
    ev = 1.0 - var(r - v) / var_r
    return ev if math.isfinite(ev) else 0.0
