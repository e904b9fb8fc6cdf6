"""Model-like shapes for composed tasks: inputs and constructor values as real models use.

A rank-2 input is ``[tokens, hidden]``, rank 3 ``[batch, seq, hidden]``, rank 4
``[batch, channels, height, width]``, rank 5 ``[batch, channels, depth, height, width]``;
the feature sizes come from ``ComposerConfig`` and the batch (then the sequence or the
image side) is set so the input holds about ``target`` elements. Every random choice is
made before the target is looked at, so a re-sized candidate keeps its features.
"""

from __future__ import annotations

import math
import random
from typing import Any

from cuda_agent.synth.catalog import SeedOp
from cuda_agent.synth.config import ComposerConfig

WIDTH_PARAMS = ("out_features", "embedding_dim", "intermediate_size")
"""Constructor values that are a layer's width: drawn from the hidden sizes."""


def _pow2_at_most(value: float) -> int:
    return 1 << max(0, int(math.floor(math.log2(max(value, 1.0)))))


def first_shape(rank: int, config: ComposerConfig, rng: random.Random, target: float
                ) -> tuple[int, ...]:
    """A model-like input shape of ``rank`` holding about ``target`` elements."""
    hidden = rng.choice(config.hidden_sizes)
    seq = rng.choice(config.seq_lens)
    channels = rng.choice(config.channels)
    side = rng.choice(config.spatial)
    small_side = rng.choice([s for s in config.spatial if s <= 64] or [16])
    depth = rng.choice((8, 16, 32))
    if rank == 1:
        return (_pow2_at_most(target),)
    if rank == 2:
        return (_pow2_at_most(target / hidden), hidden)
    if rank == 3:
        while seq > 16 and seq * hidden > target:
            seq //= 2
        return (_pow2_at_most(target / (seq * hidden)), seq, hidden)
    if rank == 4:
        while side > 7 and channels * side * side > target:
            side //= 2
        return (_pow2_at_most(target / (channels * side * side)), channels, side, side)
    channels = min(channels, 64)
    while small_side > 4 and channels * depth * small_side ** 2 > target:
        small_side //= 2
        depth = max(4, depth // 2)
    per = channels * depth * small_side ** 2
    return (_pow2_at_most(target / per), channels, depth, small_side, small_side)


def realistic(op: SeedOp, config: ComposerConfig, rng: random.Random) -> SeedOp:
    """``op`` with its fixed widths (``out_features=32``, ``out_channels=16``...) redrawn
    from the sizes models use; bound values (``"$k"``) and other settings are kept."""
    params: dict[str, Any] = dict(op.params)
    for key, value in op.params.items():
        if not isinstance(value, int) or isinstance(value, bool):
            continue
        if key in WIDTH_PARAMS:
            params[key] = rng.choice(config.hidden_sizes)
        elif key == "out_channels":
            params[key] = rng.choice([c for c in config.channels if c >= 16] or [16])
        elif key == "hidden_size":
            params[key] = rng.choice(config.hidden_sizes[:3])
    return op if params == op.params else op.model_copy(update={"params": params})
