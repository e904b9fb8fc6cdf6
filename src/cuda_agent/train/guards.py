"""Loud failures: a run with nothing to learn from stops with an error that says why.

    check_positions(config, model)          # data.max_len within the model's positions (exit 2)
    check_tokens(samples, "ppo step 3")     # some sample has a model token to train on
    check_truncation(results, config, 3)    # not every episode of a step hit its token limit
    check_gradients(norms, "rft", 5)        # a step's gradients are neither all 0 nor inf

Each of these would otherwise let a run finish with exit 0 having changed nothing: a loss
of 0 on no tokens, a gradient of 0, an actor saved unchanged. ``TrainSignalError`` ends the
command with exit 1 (``cuda-agent train``: the input was usable, the job did not get done).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from cuda_agent.train.config import TrainConfig, TrainConfigError


class TrainSignalError(RuntimeError):
    """The run had nothing to learn from (no tokens, truncated episodes, zero gradients)."""


def model_positions(model: Any) -> int | None:
    """The longest sequence the model's position embeddings take, if its config says."""
    config = getattr(model, "config", None)
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def check_positions(config: TrainConfig, model: Any) -> None:
    """``data.max_len`` must fit the model: a longer sample would index past its positions
    (a config error: ``TrainConfigError``)."""
    positions = model_positions(model)
    if positions is not None and config.data.max_len > positions:
        raise TrainConfigError(f"data.max_len={config.data.max_len} is longer than the "
                               f"model's {positions} positions ({config.model.path}); set "
                               f"data.max_len to at most {positions}")


def check_tokens(samples: Sequence[Any], where: str, max_len: int) -> None:
    """Some sample of ``samples`` must have a model token (``loss_mask`` 1) to train on."""
    if any(any(s.loss_mask) for s in samples):
        return
    firsts = [s.first_model_token for s in samples]
    raise TrainSignalError(f"{where}: none of the {len(samples)} samples has a model token "
                           f"within data.max_len={max_len} tokens (the shortest prompt "
                           f"before the model's first token is {min(firsts, default=0)} "
                           "tokens): nothing to train on; raise data.max_len")


def check_truncation(results: Sequence[Any], config: TrainConfig, step: int) -> None:
    """Not every episode of a PPO step may stop on its token limit: such a step trains on
    cut-off episodes whose reward says nothing about what the model wrote."""
    if not results or any(r.stop_reason != "token_limit" for r in results):
        return
    prompts = [r.prompt_tokens for r in results if r.prompt_tokens]
    shown = f" (prompts of up to {max(prompts)} tokens)" if prompts else ""
    raise TrainSignalError(f"ppo step {step}: all {len(results)} episodes stopped on their "
                           f"token limit (data.max_len={config.data.max_len} tokens per "
                           f"step{shown}): raise data.max_len or lower ppo.max_new_tokens")


def check_gradients(norms: Sequence[float], stage: str, step: int) -> None:
    """A whole step's gradient norms (one per optimiser update): not all zero, all finite."""
    if any(not math.isfinite(n) for n in norms):
        raise TrainSignalError(f"{stage} step {step}: the gradient norm is not finite "
                               f"({list(norms)}): the loss overflowed or the data holds "
                               "NaN; lower the learning rate or check the inputs")
    if norms and all(n == 0.0 for n in norms):
        raise TrainSignalError(f"{stage} step {step}: every gradient of the step is zero: "
                               "the loss does not depend on the trained weights (no model "
                               "token, constant advantages, or frozen weights)")
