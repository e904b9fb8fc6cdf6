"""RL math against values worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from cuda_agent.train.rl import (
    explained_variance,
    kl_penalty,
    masked_gae,
    masked_mean,
    masked_whiten,
    ppo_policy_loss,
    terminal_rewards,
    value_loss,
)

# One episode, T=5: two assistant tokens, a 2-token tool output (masked), one assistant token.
MASK = torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0]])
VALUES = torch.tensor([[0.5, 0.4, 9.0, 9.0, 0.8]])  # values under the tool span must not matter


def test_terminal_rewards_on_last_policy_token() -> None:
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 0.0, 0.0, 0.0], [0.0] * 5])
    out = terminal_rewards(torch.tensor([1.0, -1.0, 3.0]), mask)
    assert out.tolist() == [[0, 0, 0, 0, 1.0], [0, -1.0, 0, 0, 0], [0, 0, 0, 0, 0]]


def test_masked_gae_hand_computed() -> None:
    # gamma=1, lam=0.95; policy tokens t0, t1, t4; reward 1 on t4.
    # t4: delta = 1 + 0 - 0.8 = 0.2            A = 0.2                  R = 1.0
    # t1: delta = 0 + 0.8 - 0.4 = 0.4 (skips tool span)  A = 0.4 + 0.95*0.2 = 0.59   R = 0.99
    # t0: delta = 0 + 0.4 - 0.5 = -0.1         A = -0.1 + 0.95*0.59 = 0.4605       R = 0.9605
    rewards = terminal_rewards(torch.tensor([1.0]), MASK)
    adv, ret = masked_gae(rewards, VALUES, MASK, gamma=1.0, lam=0.95)
    assert adv[0].tolist() == pytest.approx([0.4605, 0.59, 0.0, 0.0, 0.2])
    assert ret[0].tolist() == pytest.approx([0.9605, 0.99, 0.0, 0.0, 1.0])


def test_masked_gae_gamma_and_ignores_masked_rewards() -> None:
    # gamma=0.5, lam=1: A_i = sum_k gamma^k r - V_i  (Monte-Carlo); reward under the mask ignored.
    rewards = torch.tensor([[0.0, 0.0, 7.0, 0.0, 2.0]])
    adv, ret = masked_gae(rewards, VALUES, MASK, gamma=0.5, lam=1.0)
    # returns: t4 = 2, t1 = 0.5*2 = 1, t0 = 0.25*2 = 0.5
    assert ret[0].tolist() == pytest.approx([0.5, 1.0, 0.0, 0.0, 2.0])
    assert adv[0].tolist() == pytest.approx([0.0, 0.6, 0.0, 0.0, 1.2])


def loop_gae(rewards, values, mask, gamma, lam):
    """The recurrence token by token, from the right (the definition, for comparison)."""
    adv = torch.zeros_like(values, dtype=torch.float64)
    for b in range(values.shape[0]):
        next_value = next_adv = 0.0
        for t in range(values.shape[1] - 1, -1, -1):
            if mask[b, t] > 0:
                delta = float(rewards[b, t]) + gamma * next_value - float(values[b, t])
                next_adv = delta + gamma * lam * next_adv
                adv[b, t], next_value = next_adv, float(values[b, t])
    return adv, (adv + values.double()) * (mask > 0)


@pytest.mark.parametrize(("length", "gamma", "lam"), [
    (7, 1.0, 0.95), (300, 1.0, 0.95), (20_000, 0.99, 0.95), (500, 1.0, 1.0), (500, 0.9, 0.0)])
def test_masked_gae_matches_the_token_recurrence(length: int, gamma: float, lam: float
                                                 ) -> None:
    # rows longer than a block (128) and than a block of blocks (16,384) take the carries
    generator = torch.Generator().manual_seed(length)
    mask = (torch.rand(3, length, generator=generator) < 0.6).float()
    mask[2] = 0.0  # a row without policy tokens
    values = torch.randn(3, length, generator=generator, dtype=torch.float64)
    rewards = torch.randn(3, length, generator=generator, dtype=torch.float64)
    adv, ret = masked_gae(rewards, values, mask, gamma=gamma, lam=lam)
    want_adv, want_ret = loop_gae(rewards, values, mask, gamma, lam)
    torch.testing.assert_close(adv, want_adv, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(ret, want_ret, rtol=1e-9, atol=1e-9)


def test_masked_gae_all_masked_is_zero() -> None:
    mask = torch.zeros(2, 4)
    adv, ret = masked_gae(torch.ones(2, 4), torch.ones(2, 4), mask)
    assert torch.equal(adv, torch.zeros(2, 4)) and torch.equal(ret, torch.zeros(2, 4))


def test_ppo_loss_unclipped_equals_minus_mean_advantage() -> None:
    lp = torch.zeros(1, 3, requires_grad=True)
    loss, stats = ppo_policy_loss(
        lp, torch.zeros(1, 3), torch.tensor([[1.0, 2.0, 3.0]]), torch.ones(1, 3)
    )
    assert loss.item() == pytest.approx(-2.0)
    assert stats == pytest.approx({"clip_fraction": 0.0, "approx_kl": 0.0, "ratio_mean": 1.0})
    loss.backward()
    assert lp.grad is not None and lp.grad[0].tolist() == pytest.approx([-1 / 3, -2 / 3, -1.0])


@pytest.mark.parametrize(
    ("ratio", "adv", "expected_loss", "clipped"),
    [
        (1.5, 1.0, -1.28, True),  # above 1+clip_high with A>0: capped at 1.28
        (1.25, 1.0, -1.25, False),  # inside the asymmetric upper band (would clip at 0.2)
        (0.5, -1.0, 0.8, True),  # below 1-clip_low with A<0: capped at 0.8
        (1.5, -1.0, 1.5, False),  # A<0, ratio high: pessimistic unclipped branch
        (0.5, 1.0, -0.5, False),  # A>0, ratio low: pessimistic unclipped branch
    ],
)
def test_ppo_loss_clip_edges(ratio: float, adv: float, expected_loss: float, clipped: bool) -> None:
    lp = torch.tensor([[math.log(ratio)]], requires_grad=True)
    loss, stats = ppo_policy_loss(lp, torch.zeros(1, 1), torch.tensor([[adv]]), torch.ones(1, 1))
    assert loss.item() == pytest.approx(expected_loss)
    assert stats["clip_fraction"] == (1.0 if clipped else 0.0)
    assert stats["ratio_mean"] == pytest.approx(ratio)
    loss.backward()
    assert lp.grad is not None
    assert (float(lp.grad) == 0.0) == clipped  # no gradient through a clipped token


def test_ppo_loss_respects_mask_and_all_masked() -> None:
    lp = torch.tensor([[0.0, 5.0]])
    loss, _ = ppo_policy_loss(
        lp, torch.zeros(1, 2), torch.tensor([[1.0, 100.0]]), torch.tensor([[1.0, 0.0]])
    )
    assert float(loss) == pytest.approx(-1.0)
    loss, stats = ppo_policy_loss(lp, torch.zeros(1, 2), torch.ones(1, 2), torch.zeros(1, 2))
    assert float(loss) == 0.0 and all(math.isfinite(v) for v in stats.values())
    # padding with -inf log-probs under mask 0 gives no NaN, in the loss or its gradient
    lp = torch.tensor([[-1.0, float("-inf")]], requires_grad=True)
    loss, _ = ppo_policy_loss(lp, torch.tensor([[-1.0, 0.0]]), torch.ones(1, 2),
                              torch.tensor([[1.0, 0.0]]))
    loss.backward()
    assert loss.item() == pytest.approx(-1.0) and torch.isfinite(lp.grad).all()


def test_value_loss_and_clipping() -> None:
    values = torch.tensor([[1.0, 0.0, 3.0]])
    returns = torch.tensor([[0.0, 50.0, 1.0]])
    mask = torch.tensor([[1.0, 0.0, 1.0]])
    # 0.5 * mean(1^2, 2^2) = 1.25
    assert float(value_loss(values, returns, mask)) == pytest.approx(1.25)
    # old = 2.5, clip 0.2: v clipped to [2.3, 2.7] -> (2.7-1)^2 = 2.89 < 4 for token 2;
    # token 0 old 0: v clipped 0.2 -> 0.04 < 1. max keeps unclipped: 0.5 * (1 + 4) / 2 = 1.25
    old = torch.tensor([[0.0, 0.0, 2.5]])
    assert float(value_loss(values, returns, mask, old, clip=0.2)) == pytest.approx(1.25)
    # old far on the wrong side: token 2 old 5.0 -> clipped v = 4.8 -> (3.8)^2 = 14.44
    old = torch.tensor([[1.0, 0.0, 5.0]])
    assert float(value_loss(values, returns, mask, old, clip=0.2)) == pytest.approx(
        0.5 * (1 + 14.44) / 2
    )
    assert float(value_loss(values, returns, torch.zeros(1, 3))) == 0.0


def test_value_targets_from_gae_train_critic_to_zero_loss() -> None:
    rewards = terminal_rewards(torch.tensor([1.0]), MASK)
    _, ret = masked_gae(rewards, VALUES, MASK, gamma=1.0, lam=0.95)
    assert float(value_loss(ret, ret, MASK)) == 0.0
    assert explained_variance(ret, ret, MASK) == pytest.approx(1.0)


def test_kl_penalty_estimators() -> None:
    lp = torch.tensor([[0.0, -1.0]])
    ref = torch.tensor([[math.log(2.0), -1.0]])
    mask = torch.ones(1, 2)
    # d = ln 2 on token 0, 0 on token 1; k3 = e^d - 1 - d = 1 - ln 2
    assert float(kl_penalty(lp, ref, mask)) == pytest.approx((1 - math.log(2.0)) / 2)
    assert float(kl_penalty(lp, ref, mask, kind="k1")) == pytest.approx(-math.log(2.0) / 2)
    assert float(kl_penalty(lp, ref, mask, kind="k2")) == pytest.approx(0.25 * math.log(2.0) ** 2)
    assert float(kl_penalty(lp, lp, mask)) == 0.0
    with pytest.raises(ValueError, match="unknown KL"):
        kl_penalty(lp, ref, mask, kind="k9")


def test_explained_variance() -> None:
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    ret = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    # V = 0: Var[R - V] = Var[R] -> 0
    assert explained_variance(torch.zeros(1, 4), ret, mask) == pytest.approx(0.0)
    # V = R + 1: the residual is constant -> 1
    assert explained_variance(ret + 1.0, ret, mask) == pytest.approx(1.0)
    # resid [1,-1,1] -> var 4/3 -> 1 - 4/3 = -1/3
    assert explained_variance(
        ret - torch.tensor([[1.0, -1.0, 1.0, 0.0]]), ret, mask
    ) == pytest.approx(-1 / 3)
    assert explained_variance(ret, ret, torch.zeros(1, 4)) == 0.0  # undefined -> 0, not NaN
    assert explained_variance(ret, torch.ones(1, 4), mask) == 0.0  # constant returns


def test_masked_mean_and_whiten() -> None:
    x = torch.tensor([[1.0, 2.0, 1000.0, 3.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0, 1.0]])
    assert float(masked_mean(x, mask)) == pytest.approx(2.0)
    w = masked_whiten(x, mask)
    assert w[0].tolist() == pytest.approx(
        [-1.0, 0.0, 0.0, 1.0], abs=1e-6
    )  # sample std of 1,2,3 is 1
    assert float(masked_mean(x, torch.zeros(1, 4))) == 0.0
    padded = torch.tensor([[1.0, float("-inf"), float("nan")]])
    assert float(masked_mean(padded, torch.tensor([[1.0, 0.0, 0.0]]))) == 1.0
    assert torch.equal(masked_whiten(x, torch.zeros(1, 4)), torch.zeros(1, 4))
    one = masked_whiten(x, torch.tensor([[0.0, 1.0, 0.0, 0.0]]))
    assert torch.isfinite(one).all() and one.abs().sum() == 0.0
