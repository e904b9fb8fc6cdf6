"""Write a tiny random GPT-2 and a byte-level BPE tokenizer to a folder (for CPU runs).

    .venv/bin/python benchmarks/train/make_tiny_model.py train-runs/tiny-model
    cuda-agent train rft --config configs/train/tiny.yaml

The weights are random (seeded): the model writes noise, which is all the trainer's CPU
pipeline needs. Nothing is downloaded. The tokenizer is trained on the texts an episode
shows the model (the agent's prompts, both SKILL.md templates, the tool specs, the shipped
examples' code), so an agent trajectory takes about as many tokens as with a real model's
tokenizer (one token per 3-4 characters), not one per byte.
"""

from __future__ import annotations

import argparse
from pathlib import Path

CORPUS = ('<tool_call>{"name": "write_file", "arguments": {"path": "kernels/k.cpp", '
          '"content": "#include <torch/extension.h>"}}</tool_call> system user assistant '
          "tool submit build verify profile model_new.py ModelNew forward return")
SUFFIXES = (".md", ".j2", ".py", ".cpp", ".cu", ".h")
VOCAB = 4096


def episode_texts() -> list[str]:
    """What an episode shows the model: prompts, SKILL.md templates, the tool specs and the
    shipped examples (read from the installed package)."""
    import json

    import cuda_agent
    from cuda_agent.agent.tool_specs import SPECS

    package = Path(cuda_agent.__file__).resolve().parent
    texts = [CORPUS, json.dumps([spec.parameters for spec in SPECS]),
             "\n".join(f"{spec.name}: {spec.description}" for spec in SPECS)]
    for folder in ("agent/prompts", "train/prompts", "workspace/templates", "examples"):
        texts += [p.read_text() for p in sorted((package / folder).rglob("*"))
                  if p.is_file() and p.suffix in SUFFIXES]
    return texts


def bpe_tokenizer(corpus: list[str], vocab: int):
    """A byte-level BPE tokenizer trained on ``corpus`` (``vocab`` ids at most)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    raw.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<|endoftext|>",
                                   pad_token="<|endoftext|>", clean_up_tokenization_spaces=False)


def make_tiny_model(folder: Path, layers: int = 2, hidden: int = 32, vocab: int = VOCAB,
                    positions: int = 32768, seed: int = 0) -> Path:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    tokenizer = bpe_tokenizer(episode_texts(), vocab)
    eos = tokenizer.eos_token_id
    config = GPT2Config(vocab_size=len(tokenizer), n_positions=positions, n_embd=hidden,
                        n_layer=layers, n_head=2, bos_token_id=eos, eos_token_id=eos)
    torch.manual_seed(seed)
    folder.mkdir(parents=True, exist_ok=True)
    GPT2LMHeadModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(make_tiny_model(args.folder, args.layers, args.hidden, seed=args.seed))


if __name__ == "__main__":
    main()
