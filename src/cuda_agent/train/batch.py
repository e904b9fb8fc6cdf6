"""Samples to padded tensors, the data order, and the trajectory files of a config.

    batch = collate(samples, pad_id=tokenizer.pad_token_id, device=device)
    batch.input_ids          # [B, T], right-padded
"""

from __future__ import annotations

import dataclasses
import glob
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from cuda_agent.train.config import TrainConfig


class TrainDataError(ValueError):
    """No usable training data."""


@dataclasses.dataclass(frozen=True)
class Batch:
    input_ids: Tensor  # [B, T] long
    attention_mask: Tensor  # [B, T] long, 1 on real tokens
    mask: Tensor  # [B, T] float, 1 on the model's own tokens
    old_logprobs: Tensor  # [B, T] float, 0 where unknown
    scores: Tensor  # [B] float, the episode rewards

    @property
    def tokens(self) -> int:
        return int(self.attention_mask.sum())


def collate(samples: Sequence[Any], pad_id: int, device: torch.device | str = "cpu") -> Batch:
    """Right-pad ``samples`` (``Sample``-like: input_ids, loss_mask, old_logprobs, reward)."""
    if not samples:
        raise TrainDataError("cannot collate an empty batch")
    length = max(len(s.input_ids) for s in samples)
    ids = torch.full((len(samples), length), pad_id, dtype=torch.long)
    attention = torch.zeros((len(samples), length), dtype=torch.long)
    mask = torch.zeros((len(samples), length))
    old = torch.zeros((len(samples), length))
    for row, sample in enumerate(samples):
        n = len(sample.input_ids)
        ids[row, :n] = torch.tensor(sample.input_ids, dtype=torch.long)
        attention[row, :n] = 1
        mask[row, :n] = torch.tensor(sample.loss_mask, dtype=torch.float)
        if sample.old_logprobs is not None:
            old[row, :n] = torch.tensor(sample.old_logprobs, dtype=torch.float)
    mask[:, 0] = 0  # the first token has no context to be scored from
    scores = torch.tensor([float(s.reward) for s in samples])
    return Batch(ids.to(device), attention.to(device), mask.to(device), old.to(device),
                 scores.to(device))


def chunks(items: Sequence[Any], size: int) -> list[Sequence[Any]]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def steps_per_epoch(n: int, batch_size: int) -> int:
    return max(1, math.ceil(n / batch_size))


def batch_indices(n: int, batch_size: int, seed: int, step: int) -> list[int]:
    """The sample indices of ``step`` (0-based): a fresh permutation per epoch, seeded by
    (seed, epoch), so a resumed run sees the same order."""
    per_epoch = steps_per_epoch(n, batch_size)
    epoch, k = divmod(step, per_epoch)
    generator = torch.Generator().manual_seed(seed * 100_003 + epoch)
    order = torch.randperm(n, generator=generator).tolist()
    return order[k * batch_size:(k + 1) * batch_size]


def total_steps(n: int, config: TrainConfig) -> int:
    steps = config.optim.epochs * steps_per_epoch(n, config.optim.batch_size)
    return min(steps, config.optim.max_steps) if config.optim.max_steps else steps


def trajectory_paths(config: TrainConfig) -> list[Path]:
    """The files named by ``data.trajectories`` (globs) and ``data.manifest``, sorted."""
    found: set[Path] = set()
    for pattern in config.data.trajectories:
        full = str(config.resolve(pattern))
        found.update(Path(p) for p in glob.glob(full, recursive=True) if Path(p).is_file())
    if config.data.manifest:
        manifest = config.resolve(config.data.manifest)
        if not manifest.is_file():
            raise TrainDataError(f"rollout manifest not found: {manifest}")
        for line in manifest.read_text().splitlines():
            if not line.strip():
                continue
            record = json.loads(line)
            path = record.get("trajectory") if isinstance(record, dict) else None
            if path:
                p = Path(path)
                found.add(p if p.is_absolute() else manifest.parent / p)
    if not found:
        raise TrainDataError("no trajectory files: set data.trajectories (globs) or "
                             "data.manifest")
    return sorted(found)
