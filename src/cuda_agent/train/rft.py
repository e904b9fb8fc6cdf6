"""Rejection fine-tuning: supervised training of the actor on selected trajectories.

    cuda-agent train rft --config configs/train/tiny.yaml

The trajectories of ``data.trajectories`` / ``data.manifest`` pass the selection
(``select.select_trajectories``: positive reward, no redundant loops, no malformed calls)
unless ``data.select`` is off; each becomes one Sample. The loss is the mean negative
log-likelihood of the tokens the model wrote (``loss_mask == 1``); prompts and tool outputs
carry no loss. The trained actor is written to ``OUT/actor-rft/``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from cuda_agent.train.batch import (
    Batch,
    TrainDataError,
    batch_indices,
    chunks,
    collate,
    total_steps,
    trajectory_paths,
)
from cuda_agent.train.config import TrainConfig
from cuda_agent.train.guards import check_gradients, check_positions, check_tokens
from cuda_agent.train.models import load_actor, save_actor, token_logprobs
from cuda_agent.train.progress import Progress
from cuda_agent.train.run import Run, clip_and_step, make_optimizer, seed_everything


@dataclasses.dataclass(frozen=True)
class StageResult:
    """What a training command did."""

    out: Path
    steps: int
    final: Path | None
    metrics: tuple[dict[str, Any], ...]
    curves: tuple[Path, ...]


def sft_loss(model: nn.Module, batch: Batch, denominator: float) -> torch.Tensor:
    """Sum of -log p over mask tokens, divided by ``denominator`` (the batch's mask count)."""
    logprobs = token_logprobs(model, batch.input_ids, batch.attention_mask)  # [B, T]
    return -(logprobs * batch.mask).sum() / max(denominator, 1.0)


def load_samples(config: TrainConfig, tokenizer: Any, select: bool | None = None
                 ) -> list[Any]:
    """The trajectories of the config as Samples with a model token (at least one), passed
    through the RFT selection when ``select`` (default ``data.select``)."""
    from cuda_agent.train.samples import SampleError, samples_from_trajectory

    paths = trajectory_paths(config)
    if config.data.select if select is None else select:
        from cuda_agent.train.select import SelectConfig, select_trajectories

        report = select_trajectories(paths, SelectConfig(**config.data.selection))
        paths = list(report.kept)
        if not paths:
            raise TrainDataError(f"the selection kept none of the {len(report.dropped)} "
                                 "trajectories (set data.select: false to use them all)")
    samples = []
    for path in paths:
        try:
            samples.append(samples_from_trajectory(path, tokenizer, max_len=config.data.max_len))
        except SampleError:
            continue
    if not samples:
        raise TrainDataError(f"none of the {len(paths)} trajectories has a model token")
    check_tokens(samples, f"{len(paths)} trajectories", config.data.max_len)
    return [s for s in samples if any(s.loss_mask)]


def fit(config: TrainConfig, stage: str, name: str, model: nn.Module, lr: float,
        samples: list[Any], step: Callable[[list[Any], Any, torch.device], dict[str, float]]
        ) -> tuple[Run, int]:
    """The step loop RFT and value pretraining share: an optimizer for ``model`` (saved in
    checkpoints as ``name``), resume, then ``step(batch, optimizer, device)`` on each batch
    of ``samples`` with logging, checkpoints and progress. Returns the run and its steps."""
    run = Run(config, stage)
    optimizer = make_optimizer(model, lr, config)
    modules, optimizers = {name: model}, {name: optimizer}
    start = run.resume(modules, optimizers)
    steps = total_steps(len(samples), config)
    device = next(model.parameters()).device
    model.train()
    with Progress(config, stage, steps, start) as progress:
        for k in range(start + 1, steps + 1):
            chosen = [samples[i] for i in batch_indices(len(samples), config.optim.batch_size,
                                                        config.optim.seed, k - 1)]
            metrics = step(chosen, optimizer, device)
            check_gradients([metrics["grad_norm"]], stage, k)
            run.log(k, metrics, force=k == steps)
            run.maybe_save(k, k == steps, modules, optimizers)
            progress.advance(metrics)
    return run, steps


def train_rft(config: TrainConfig) -> StageResult:
    seed_everything(config.optim.seed)
    actor, tokenizer = load_actor(config.model)
    check_positions(config, actor)
    samples = load_samples(config, tokenizer)

    def step(chosen: list[Any], optimizer: Any, device: torch.device) -> dict[str, float]:
        return rft_step(actor, optimizer, chosen, tokenizer.pad_token_id, device, config)

    run, steps = fit(config, "rft", "actor", actor, config.optim.lr, samples, step)
    final = run.out / "actor-rft"
    save_actor(actor, tokenizer, final)
    curves = run.finish()
    return StageResult(run.out, steps, final, tuple(run.records()), tuple(curves))


def rft_step(model: nn.Module, optimizer: Any, samples: list[Any], pad_id: int,
             device: torch.device, config: TrainConfig) -> dict[str, float]:
    """One optimiser step over ``samples`` in micro-batches; the step's metrics."""
    opt, schedule = optimizer
    begin = time.perf_counter()
    micro = [collate(part, pad_id, device) for part in chunks(samples,
                                                              config.optim.micro_batch_size)]
    denominator = float(sum(float(b.mask.sum()) for b in micro))
    opt.zero_grad(set_to_none=True)
    total = 0.0
    for batch in micro:
        loss = sft_loss(model, batch, denominator)
        loss.backward()
        total += float(loss.detach())
    norm = clip_and_step(model, optimizer, config.optim.grad_clip)
    seconds = time.perf_counter() - begin
    tokens = sum(b.tokens for b in micro)
    return {"loss": total, "grad_norm": norm, "lr": schedule.get_last_lr()[0],
            "tokens_per_s": tokens / max(seconds, 1e-9), "mask_tokens": denominator}
