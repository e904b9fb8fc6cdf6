"""LLM composer: a chat model writes the fused task through an OpenAI-compatible endpoint.

    cuda-agent synth --composer llm --set llm.base_url=http://localhost:8000/v1 \\
        --set llm.model=Qwen2.5-Coder-32B-Instruct --count 100 --out runs/llm100

Operators and their count are sampled exactly as the rules composer does; the prompt
(``templates/llm_compose.md.j2``) shows each operator's confirmed call and shapes. The reply's
code block must pass ``check_source``; it then goes through the same filters as every task.
The API key is read from the environment variable named by ``llm.api_key_env``.
"""

from __future__ import annotations

import math
import os
import random
import re

import jinja2

from cuda_agent.synth.catalog import SeedOp
from cuda_agent.synth.compose import Candidate, RulesComposer, data_source, sample_count
from cuda_agent.synth.config import ComposerConfig, LLMConfig
from cuda_agent.tasks.task import TaskError, check_source

_ENV = jinja2.Environment(loader=jinja2.PackageLoader("cuda_agent.synth", "templates"),
                          trim_blocks=True, lstrip_blocks=True)
_BLOCK = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL)


def extract_code(reply: str) -> str:
    """The longest fenced code block of a reply, or the reply itself when it has none."""
    blocks = _BLOCK.findall(reply)
    return max(blocks, key=len).strip() + "\n" if blocks else reply.strip() + "\n"


def example_call(op: SeedOp) -> str:
    names = {f"in{i}": f"in{i}" for i in range(1, len(op.inputs))}
    names.update({f"mod_{s}": f"mod_{s}" for s in op.extra_init})
    if op.kind == "module":
        ctor = op.init_code.format(**{k: repr(v) for k, v in op.params.items()})
        return f"`{ctor}` called as `{op.call_code.format(mod='m', x='x', **names)}`"
    return f"`{op.call_code.format(x='x', **names, **{k: repr(v) for k, v in op.params.items()})}`"


class LLMComposer:
    """Asks a chat model to compose the sampled operators."""

    name = "llm"

    def __init__(self, catalog: list[SeedOp], compose: ComposerConfig, llm: LLMConfig,
                 device: str = "cpu"):
        self.rules = RulesComposer(catalog, compose, device)
        self.compose_config = compose
        self.llm = llm
        self.device = device
        self._client = None

    def client(self):
        if self._client is None:
            from openai import OpenAI

            base = self.llm.base_url or os.environ.get("OPENAI_BASE_URL", "")
            if not base:
                raise ValueError("the LLM composer needs llm.base_url (or $OPENAI_BASE_URL)")
            self._client = OpenAI(base_url=base, timeout=self.llm.timeout_s,
                                  api_key=os.environ.get(self.llm.api_key_env) or "none")
        return self._client

    def prompt(self, seed: int, scale: float = 1.0) -> tuple[str, list[SeedOp]]:
        rng = random.Random(seed)
        n = sample_count(rng, self.compose_config.ops_mix)
        heavy_first = rng.random() < self.compose_config.compute_share
        ops = [self.rules.draw(rng, heavy=i == 0 and heavy_first) for i in range(n)]
        if self.rules.hf_ops and rng.random() < self.compose_config.transformers_share:
            ops[rng.randrange(n)] = rng.choice(self.rules.hf_ops)
        lo, hi = self.compose_config.numel_range(self.device)
        numel = int(math.exp(rng.uniform(math.log(lo), math.log(hi))) * scale)
        views = [{"op": op.op, "example_call": example_call(op), "example": op.example,
                  "out_example": op.out_example} for op in ops]
        return _ENV.get_template("llm_compose.md.j2").render(ops=views, numel=numel), ops

    def compose(self, seed: int, scale: float = 1.0) -> Candidate | None:
        text, ops = self.prompt(seed, scale)
        model = self.llm.model or os.environ.get("CUDA_AGENT_LLM_MODEL", "")
        for attempt in range(self.llm.attempts):
            reply = self.client().chat.completions.create(
                model=model, messages=[{"role": "user", "content": text}],
                temperature=self.llm.temperature, max_tokens=self.llm.max_tokens,
                seed=seed + attempt)
            code = extract_code(reply.choices[0].message.content or "")
            try:
                check_source(code, f"llm reply for seed {seed}")
            except TaskError:
                continue
            return Candidate(name=f"synth_{seed:08d}", code=code,
                             ops=tuple(op.op for op in ops), data_source=data_source(ops),
                             composer=self.name, seed=seed, scale=scale)
        return None
