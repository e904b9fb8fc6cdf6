"""Models for the extract tests, importable as ``tests.integrate.extract_models``."""

from __future__ import annotations

import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

CONFIG = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
              num_key_value_heads=2, vocab_size=100)


def tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**CONFIG)).eval()


class Gate(nn.Module):
    """Forward with a tuple of tensors, a tensor keyword and constants."""

    def __init__(self, dim: int, act: type = nn.GELU, *, bias: bool = True) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, dim, bias=bias)
        self.act = act()

    def forward(self, x, pair, scale=1.0, mask=None):
        y = self.act(self.proj(x)) * pair[0] + pair[1] * scale
        return y if mask is None else y * mask[..., None]


def gate_sample() -> dict:
    x = torch.randn(2, 5, 8)
    return {"x": x, "pair": (torch.randn(8), torch.randn(2, 5, 8)), "scale": 0.5,
            "mask": torch.randint(0, 2, (2, 5))}


class Scaled(nn.Module):
    """Constructor argument with no source form: a tensor."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight.clone())

    def forward(self, x):
        return x * self.weight


def scaled() -> nn.Sequential:
    return nn.Sequential(Scaled(torch.arange(4.0)), nn.ReLU())
