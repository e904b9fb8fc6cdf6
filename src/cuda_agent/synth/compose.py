"""Composers: turn 1-5 seed operators into one KernelBench-format task.

``RulesComposer`` (the default, no LLM) samples an ops count from the configured mix, draws
each operator's class from the op-class mix (the first one compute-heavy in
``compute_share`` of tasks), picks an operator of that class whose accepted ranks fit the
running tensor, propagates shapes on the meta device, and sizes the first input like a
model's so the workload lands near the runtime window (``scale`` multiplies the size target
when the pipeline re-sizes a task). ``LLMComposer``
(``cuda_agent.synth.llm``) asks a chat model to write the fused program instead.
"""

from __future__ import annotations

import dataclasses
import math
import random
import warnings
from typing import Protocol

from cuda_agent.synth.catalog import COMPUTE_HEAVY, SeedOp, op_class
from cuda_agent.synth.config import ComposerConfig
from cuda_agent.synth.probe_op import build_call, make_input
from cuda_agent.synth.render import Step, render_task
from cuda_agent.synth.sizing import first_shape, realistic

PREFERRED_RANKS = {"gemm": (2, 3), "attention": (3,), "norm": (2, 3, 4)}
"""Ranks a first operator of these classes takes in models (a linear layer on tokens)."""


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A composed task before filtering."""

    name: str
    code: str
    ops: tuple[str, ...]
    data_source: str
    composer: str
    seed: int
    scale: float = 1.0


class Composer(Protocol):
    """Makes one candidate task per seed; ``None`` when no valid composition was found."""

    name: str

    def compose(self, seed: int, scale: float = 1.0) -> Candidate | None: ...


def sample_count(rng: random.Random, mix: dict[int, float]) -> int:
    counts = sorted(mix)
    return rng.choices(counts, weights=[mix[c] for c in counts])[0]


def data_source(ops: list[SeedOp]) -> str:
    source = "transformers" if any(op.source == "transformers" for op in ops) else "torch"
    return f"{source}#{len(ops)}"


class RulesComposer:
    """Rule-based sequential composition with meta-device shape propagation."""

    name = "rules"

    def __init__(self, catalog: list[SeedOp], config: ComposerConfig, device: str = "cpu"):
        self.config = config
        self.device = device
        usable = [op for op in catalog if op.usable and max(op.ranks, default=0) >= 1]
        rare = set(config.rare_ops)
        self.by_class: dict[str, tuple[list[SeedOp], list[float]]] = {}
        for op in usable:
            weight = config.rare_weight if op.op in rare else 1.0
            if op.source == "torch" and weight > 0:
                ops, weights = self.by_class.setdefault(op_class(op), ([], []))
                ops.append(op)
                weights.append(weight)
        self.hf_ops = [op for op in usable if op.source == "transformers"
                       and op.op not in rare]
        self.classes = [c for c, w in config.class_mix.items() if w > 0 and c in self.by_class]
        if not self.classes:
            raise ValueError(f"compose.class_mix {config.class_mix} names no class with "
                             f"operators; classes: {sorted(self.by_class)}")
        self.heavy = [c for c in COMPUTE_HEAVY if c in self.by_class]

    def draw(self, rng: random.Random, heavy: bool) -> SeedOp:
        """One operator: its class from the mix (a compute-heavy one when ``heavy``), then
        an operator of that class by weight."""
        classes = self.heavy if heavy and self.heavy else self.classes
        weights = [self.config.class_mix.get(c, 0.0) for c in classes]
        cls = rng.choices(classes, weights=weights if any(weights) else None)[0]
        ops, op_weights = self.by_class[cls]
        return rng.choices(ops, weights=op_weights)[0]

    def sample_ops_count(self, rng: random.Random) -> tuple[int, int | None]:
        """(ops count, position of the transformers block or None)."""
        n = sample_count(rng, self.config.ops_mix)
        hf = self.hf_ops and rng.random() < self.config.transformers_share
        return n, (rng.randrange(n) if hf else None)

    def compose(self, seed: int, scale: float = 1.0) -> Candidate | None:
        rng = random.Random(seed)
        n, hf_at = self.sample_ops_count(rng)
        heavy_first = rng.random() < self.config.compute_share
        lo, hi = self.config.numel_range(self.device)
        target = math.exp(rng.uniform(math.log(lo), math.log(hi))) * scale
        steps: list[Step] = []
        shape: tuple[int, ...] = ()
        dtype = "float32"
        for position in range(n):
            step = None
            for _ in range(self.config.retries):
                op = (rng.choice(self.hf_ops) if position == hf_at
                      else self.draw(rng, heavy=position == 0 and heavy_first))
                if not self._fits(op, position, n, shape, dtype, steps):
                    continue
                op = realistic(op, self.config, rng)
                start = shape or self._first_shape(op, rng, target)
                step = self._apply(op, start)
                if step is not None:
                    break
            if step is None:
                return None
            steps.append(step)
            shape, dtype = step.out_shape, step.out_dtype
        ops = [s.op for s in steps]
        code = render_task(steps)
        name = f"synth_{seed:08d}"
        return Candidate(name=name, code=code, ops=tuple(op.op for op in ops),
                         data_source=data_source(ops), composer=self.name, seed=seed,
                         scale=scale)

    def _fits(self, op: SeedOp, position: int, n: int, shape: tuple[int, ...], dtype: str,
              steps: list[Step]) -> bool:
        if steps and steps[-1].op.op == op.op:
            return False
        last = position == n - 1
        if op.out_dtype == "bool" or not last and op.out_dtype not in ("float32", "float64"):
            return False
        if position == 0:
            return True
        return (len(shape) in op.ranks and dtype == "float32"
                and op.inputs[0].dtype == "float32" and op.inputs[0].domain == "normal"
                and all(s.domain == "normal" for s in op.inputs[1:]))

    def _first_shape(self, op: SeedOp, rng: random.Random, target: float) -> tuple[int, ...]:
        ranks = [r for r in op.ranks if r >= 2] or list(op.ranks)
        preferred = [r for r in ranks if r in PREFERRED_RANKS.get(op_class(op), ())]
        return first_shape(rng.choice(preferred or ranks), self.config, rng, target)

    def _apply(self, op: SeedOp, shape: tuple[int, ...]) -> Step | None:
        """Bind ``op`` to an input of ``shape`` and run it on meta tensors."""
        import torch

        try:
            fn, params, ns = build_call(op, shape, "meta")
            extras = [make_input(s, shape, "meta") for s in op.inputs[1:]]
            first = op.inputs[0].model_copy(update={"shape": shape})
            with torch.device("meta"), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                out = fn(make_input(first, shape, "meta"), *extras)
        except Exception:
            return None
        weights = sum(p.numel() for p in ns["mod"].parameters()) if "mod" in ns else 0
        if not isinstance(out, torch.Tensor) or out.numel() == 0:
            return None
        biggest = max([out.numel(), weights, *(t.numel() for t in extras)])
        if biggest > self.config.max_intermediate_numel:
            return None
        return Step(op=op, in_shape=shape, params=params,
                    extra_shapes=tuple(tuple(t.shape) for t in extras),
                    out_shape=tuple(out.shape), out_dtype=str(out.dtype).removeprefix("torch."))
