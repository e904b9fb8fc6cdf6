"""Helpers of the trainer tests: tiny random models written to a folder, small configs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cuda_agent.train.config import TrainConfig, load_config

__all__ = ["build_digit_model", "build_tiny_model", "tiny_config"]

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "train" / "make_tiny_model.py"


def build_tiny_model(folder: Path, seed: int = 0) -> Path:
    """The tiny random GPT-2 of benchmarks/train/make_tiny_model.py (32k positions, so
    whole agent trajectories fit)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_tiny_model", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.make_tiny_model(folder, seed=seed)


def build_digit_model(folder: Path, seed: int = 0) -> Path:
    """A 2-layer GPT-2 over the ten digits and an end token (for the toy task)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    vocab = {"<|endoftext|>": 0, **{str(d): d + 1 for d in range(10)}}
    raw = Tokenizer(models.WordLevel(vocab, unk_token="<|endoftext|>"))
    raw.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Whitespace(),
                                                 pre_tokenizers.Digits(individual_digits=True)])
    raw.decoder = decoders.WordPiece()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<|endoftext|>",
                                        pad_token="<|endoftext|>")
    config = GPT2Config(vocab_size=len(vocab), n_positions=64, n_embd=32, n_layer=2, n_head=2,
                        bos_token_id=0, eos_token_id=0)
    torch.manual_seed(seed)
    GPT2LMHeadModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def tiny_config(model_path: Path, out: Path, **sections: Any) -> TrainConfig:
    """A CPU config on ``model_path`` writing to ``out``; ``sections`` update its sections."""
    data: dict[str, Any] = {
        "model": {"path": str(model_path), "device": "cpu"},
        "optim": {"lr": 1e-3, "critic_lr": 1e-3, "batch_size": 2, "micro_batch_size": 1},
        "logging": {"out_dir": str(out), "tensorboard": False, "progress": False},
        "checkpoint": {"every": 1, "keep": 5},
    }
    for name, values in sections.items():
        data[name] = {**data.get(name, {}), **values}
    return load_config(data=data)
