"""Mixed precision for trained models: weights kept in fp32, forward passes in bf16.

A weight stored in bf16 has 8 significant bits, so an optimiser step smaller than about
0.4% of the weight rounds back to the same value: at the learning rates of agentic RL
(3e-6) nearly every update of a bf16 weight is lost. The trainer therefore keeps the weights
it trains in fp32 and marks the model with the precision its forward passes run at; every
forward pass (training, log-probabilities, generation) enters ``compute_precision``:

    mark_compute_dtype(model, torch.bfloat16)
    with compute_precision(model):
        logits = model(input_ids=ids).logits
"""

from __future__ import annotations

import contextlib
from typing import Any

COMPUTE_DTYPE_ATTR = "cuda_agent_compute_dtype"


def mark_compute_dtype(model: Any, dtype: Any) -> None:
    """Run ``model``'s forward passes under autocast to ``dtype`` (see compute_precision)."""
    setattr(model, COMPUTE_DTYPE_ATTR, dtype)


def compute_dtype(model: Any) -> Any:
    """The dtype ``model`` was marked to compute in, or None (it computes in its own)."""
    return getattr(model, COMPUTE_DTYPE_ATTR, None)


def compute_precision(model: Any) -> contextlib.AbstractContextManager:
    """Autocast to the model's marked compute dtype on its device; a no-op if unmarked."""
    dtype = compute_dtype(model)
    if dtype is None:
        return contextlib.nullcontext()
    import torch

    device = next(model.parameters()).device
    return torch.autocast(device.type, dtype=dtype)
