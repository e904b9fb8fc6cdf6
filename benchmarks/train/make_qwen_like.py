"""Write a RANDOM Qwen2 model of Qwen2.5-0.5B's shape, a local tokenizer and synthetic
agent trajectories (for throughput runs of the trainer where nothing can be downloaded).

    python benchmarks/train/make_qwen_like.py /tmp/qwen-random --trajectories /tmp/trajs
    python benchmarks/train/make_qwen_like.py /tmp/small --layers 2 --hidden 64 --heads 2 \
        --kv-heads 1 --intermediate 128 --vocab 4096 --trajectories /tmp/trajs --count 4

The default shape is Qwen2.5-0.5B's (hidden 896, 24 layers, 14 heads, 2 KV heads, MLP 4864,
vocab 151936, tied embeddings, 32768 positions), so the compute and memory per token match
the real model (the lm_head over all 151936 ids included); the weights are random (seeded)
and saved in bf16. The tokenizer is a byte-level BPE trained here on CUDA-like text (a small
vocabulary: every id it makes is far below the model's vocab size). Each trajectory is one
multi-turn episode (read, write kernels, build, verify, profile, submit) that ends 'done'
with reward 3, so the RFT selection keeps it; its length is drawn in
[--min-tokens, --max-tokens] tokens of the trainer's sample (the plain chat template).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

WORDS = ("float", "int", "const", "threadIdx.x", "blockIdx.x", "blockDim.x", "__global__",
         "__shared__", "__syncthreads()", "return", "for", "if", "tmp", "acc", "scale", "bias",
         "out", "in", "row", "col", "idx", "warp", "lane", "sum", "max", "expf", "tanhf",
         "erff", "fmaf", "__shfl_down_sync", "torch::Tensor", "at::cuda", "stride", "half2",
         "float4", "reinterpret_cast", "static_cast", "TORCH_CHECK", "x.size(0)", "n")
PROSE = ("the", "kernel", "is", "memory", "bound", "so", "fusing", "the", "passes", "saves",
         "bandwidth", "next", "I", "will", "vectorise", "loads", "with", "float4", "and",
         "use", "one", "warp", "per", "row", "verify", "profile", "faster", "than", "eager",
         "torch.compile", "correct", "reduce", "shared", "tile", "occupancy", "registers")


def code(rng: random.Random, lines: int) -> str:
    """CUDA-looking lines with random identifiers and numbers (not one repeated block)."""
    out = ["#include <torch/extension.h>", "#include <cuda_runtime.h>", ""]
    for i in range(lines):
        words = rng.choices(WORDS, k=rng.randint(4, 10))
        number = f"{rng.uniform(-4, 4):.{rng.randint(1, 6)}f}"
        out.append("    " * rng.randint(0, 3) + f"{' '.join(words)} = v{i}_{rng.randint(0, 999)}"
                   f" * {number};")
    return "\n".join(out)


def prose(rng: random.Random, words: int) -> str:
    return " ".join(rng.choices(PROSE, k=words)).capitalize() + "."


def make_tokenizer(folder: Path, vocab: int, seed: int) -> Any:
    from make_tiny_model import bpe_tokenizer  # beside this file

    rng = random.Random(seed)
    corpus = [code(rng, 40) + "\n" + prose(rng, 60) for _ in range(200)]
    corpus += ['<tool_call>{"name": "write_file", "arguments": {"path": "kernels/k.cu"}}'
               "</tool_call> <|system|> <|user|> <|assistant|> <|tool|>"] * 20
    tokenizer = bpe_tokenizer(corpus, vocab)
    tokenizer.save_pretrained(folder)
    return tokenizer


def make_model(folder: Path, tokenizer: Any, args: argparse.Namespace) -> int:
    """The random Qwen2 in bf16; its parameter count."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if len(tokenizer) > args.vocab:
        raise SystemExit(f"tokenizer has {len(tokenizer)} ids > model vocab {args.vocab}")
    eos = tokenizer.eos_token_id
    config = Qwen2Config(vocab_size=args.vocab, hidden_size=args.hidden,
                         intermediate_size=args.intermediate, num_hidden_layers=args.layers,
                         num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                         max_position_embeddings=32768, rope_theta=1000000.0,
                         rms_norm_eps=1e-6, tie_word_embeddings=True, use_cache=True,
                         bos_token_id=eos, eos_token_id=eos, pad_token_id=eos)
    torch.manual_seed(args.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):  # random init on the GPU when there is one (seconds)
        model = Qwen2ForCausalLM(config)
    model = model.to(torch.bfloat16)
    model.config.dtype = torch.bfloat16
    model.save_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


def trajectory(rng: random.Random, tokenizer: Any, target: int, index: int
               ) -> list[dict[str, Any]]:
    """One synthetic episode of about ``target`` tokens (records of agent/trajectory.py)."""
    task = f"synthetic_{index}"
    records: list[dict[str, Any]] = [
        {"type": "episode_start", "version": 1, "task": task, "policy": "synthetic",
         "config": {}},
        {"type": "message", "message": {"role": "system", "content": "# SKILL: make the "
                                        "program faster with CUDA kernels\n\n" +
                                        prose(rng, 300)}},
        {"type": "message", "message": {"role": "user", "content": f"Make the task `{task}` "
                                        "faster: write `ModelNew` in `model_new.py`."}},
    ]
    used = sum(len(tokenizer(r["message"]["content"])["input_ids"]) for r in records[1:])
    used += 2900  # the tool descriptions of the system turn (plain template)
    turn = 0
    while True:
        turn += 1
        last = used >= target
        if last:
            call = {"name": "submit", "arguments": {"message": "fused kernel"}}
            output = "submitted; the workspace will now be judged"
        else:
            kind = rng.choice(("write_file", "write_file", "build", "verify", "profile"))
            if kind == "write_file":
                body = code(rng, rng.randint(20, 60))
                call = {"name": kind, "arguments": {"path": f"kernels/k{turn}.cu",
                                                    "content": body}}
                output = f"overwrote kernels/k{turn}.cu ({body.count(chr(10)) + 1} lines)"
            else:
                call = {"name": kind, "arguments": {}}
                output = f"{kind} ok: " + prose(rng, rng.randint(20, 200))
        call_id = f"call-{turn}"
        content = prose(rng, rng.randint(10, 60))
        records.append({"type": "message", "message": {
            "role": "assistant", "content": content,
            "tool_calls": [{"id": call_id, **call, "raw_arguments": ""}]}})
        records.append({"type": "step", "turn": turn, "usage": {"prompt_tokens": 0,
                                                                "completion_tokens": 0},
                        "seconds": 0.0, "tokens": None})
        records.append({"type": "message", "message": {
            "role": "tool", "content": output, "tool_call_id": call_id, "name": call["name"]}})
        records.append({"type": "tool_result", "turn": turn, "tool_call_id": call_id,
                        "name": call["name"], "ok": True, "output": output, "data": None,
                        "seconds": 0.0})
        used += 30 + len(tokenizer(content + json.dumps(call["arguments"]) + output)["input_ids"])
        if last:
            break
    records.append({"type": "episode_end", "result": {
        "task": task, "policy": "synthetic", "stop_reason": "done", "turns": turn,
        "reward": 3, "final": {"task": task, "correct": True, "reward": 3}}})
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="model + tokenizer folder")
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--hidden", type=int, default=896)
    parser.add_argument("--heads", type=int, default=14)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--intermediate", type=int, default=4864)
    parser.add_argument("--vocab", type=int, default=151936, help="model vocabulary size")
    parser.add_argument("--tokenizer-vocab", type=int, default=4096)
    parser.add_argument("--trajectories", type=Path, default=None,
                        help="also write synthetic trajectories to this folder")
    parser.add_argument("--count", type=int, default=16, help="trajectories")
    parser.add_argument("--min-tokens", type=int, default=4500)
    parser.add_argument("--max-tokens", type=int, default=7500)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    args.folder.mkdir(parents=True, exist_ok=True)
    tokenizer = make_tokenizer(args.folder, args.tokenizer_vocab, args.seed)
    params = make_model(args.folder, tokenizer, args)
    print(f"model: {args.folder} ({params / 1e6:.1f}M parameters, bf16, random); "
          f"tokenizer: {len(tokenizer)} ids")
    if args.trajectories is None:
        return
    from cuda_agent.train.samples import samples_from_trajectory

    args.trajectories.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    lengths = []
    for i in range(args.count):
        path = args.trajectories / f"synthetic-{i:03d}.jsonl"
        records = trajectory(rng, tokenizer, rng.randint(args.min_tokens, args.max_tokens), i)
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
        sample = samples_from_trajectory(path, tokenizer)
        assert max(sample.input_ids) < args.vocab
        lengths.append((len(sample), sum(sample.loss_mask)))
    total = [n for n, _ in lengths]
    print(f"trajectories: {args.count} in {args.trajectories}; sample tokens "
          f"min {min(total)} mean {sum(total) / len(total):.0f} max {max(total)}; "
          f"assistant (loss) tokens mean {sum(m for _, m in lengths) / len(lengths):.0f}")


if __name__ == "__main__":
    main()
