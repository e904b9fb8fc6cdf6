"""Digests of a call's inputs, to tell the judge whether a candidate changed them.

The reference process makes each kept call's inputs from the call's seed and reports their
digests; the candidate's process makes the same inputs from the same seed, and, when the
judge keeps the call, copies them into the pack as they are after the call returned. The
judge digests that copy and compares. A digest is a sum over the inputs' 16-bit words, each
times a weight drawn from a generator seeded with a key only the judge and the reference
know, modulo a prime: any change a candidate could make without the key passes with odds of
about 1 in 2^31 per word it must balance, and the key changes every judgement.
"""

from __future__ import annotations

from typing import Any

import torch

PRIME = 2**31 - 1
CHUNK = 1 << 15
"""Words weighed at a time: each chunk's sum stays below 2^63 (16-bit words times 31-bit
weights, 2^15 of them)."""


def digest(values: list[Any], key: int) -> list[str]:
    """One digest per input: a tensor's dtype, shape and weighted sum of its words; any
    other value's ``repr``."""
    out = []
    for k, value in enumerate(values):
        if not isinstance(value, torch.Tensor):
            out.append(f"value:{value!r}"[:200])
            continue
        out.append(f"{str(value.dtype).removeprefix('torch.')}{list(value.shape)}:"
                   f"{_weighed(value, key * 1_000_003 + k)}")
    return out


def _weighed(tensor: torch.Tensor, key: int) -> int:
    flat = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
    if flat.numel() % 2:
        flat = torch.cat([flat, flat.new_zeros(1)])
    words = flat.view(torch.int16)
    generator = torch.Generator(device=words.device)
    generator.manual_seed(key % 2**63)
    total = torch.zeros((), dtype=torch.int64, device=words.device)
    for start in range(0, words.numel(), CHUNK * 64):
        block = words[start:start + CHUNK * 64].to(torch.int64) + 32768  # 0 .. 65535
        weights = torch.randint(0, PRIME, (block.numel(),), generator=generator,
                                device=words.device, dtype=torch.int64)
        sums = (block * weights).view(-1)
        pad = (-sums.numel()) % CHUNK
        if pad:
            sums = torch.cat([sums, sums.new_zeros(pad)])
        total = (total + (sums.view(-1, CHUNK).sum(dim=1) % PRIME).sum()) % PRIME
    return int(total)
