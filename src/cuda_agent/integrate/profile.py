"""Which sub-modules of a model are worth optimizing: their share of forward time.

Forward pre- and post-hooks time every module call (synchronising the device first when it
is a GPU, which slows the run a little but attributes time to the right module). Inclusive
time is the whole call; self time is what the module spends outside its sub-modules (its
own functional ops and Python). Self times add up to the total. Repeated structures
(``layers.3.mlp``) are grouped under a wildcard pattern (``layers.*.mlp``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from cuda_agent.integrate.capture import group_name, run_samples
from cuda_agent.integrate.specs import Sample


@dataclass(frozen=True)
class ModuleTime:
    """One module (or a group of repeated modules) and its time over the timed forwards."""

    name: str
    kind: str
    count: int
    calls: int
    inclusive_ms: float
    self_ms: float
    inclusive_share: float
    self_share: float


@dataclass(frozen=True)
class Ranking:
    """Modules by inclusive time, with the total forward time they are shares of."""

    total_ms: float
    repeats: int
    modules: tuple[ModuleTime, ...] = field(default_factory=tuple)


@dataclass
class _Timer:
    device: torch.device
    inclusive: dict[str, float] = field(default_factory=dict)
    own: dict[str, float] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)
    stack: list[list[float]] = field(default_factory=list)

    def now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def enter(self) -> None:
        self.stack.append([self.now(), 0.0])

    def leave(self, name: str) -> None:
        start, children = self.stack.pop()
        elapsed = self.now() - start
        self.inclusive[name] = self.inclusive.get(name, 0.0) + elapsed
        self.own[name] = self.own.get(name, 0.0) + elapsed - children
        self.calls[name] = self.calls.get(name, 0) + 1
        if self.stack:
            self.stack[-1][1] += elapsed


@contextlib.contextmanager
def _hooks(model: nn.Module, timer: _Timer) -> Iterator[None]:
    handles = []
    for name, module in model.named_modules():
        handles.append(module.register_forward_pre_hook(lambda *_: timer.enter()))
        handles.append(module.register_forward_hook(
            lambda *_, name=name: timer.leave(name), always_call=True))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def time_modules(model: nn.Module, samples: Sequence[Sample], repeats: int = 3,
                 warmup: int = 1) -> Ranking:
    """Per-module times over ``repeats`` passes through ``samples`` (after ``warmup``)."""
    device = next((t.device for t in model.parameters()), torch.device("cpu"))
    for _ in range(warmup):
        run_samples(model, samples, device)
    timer = _Timer(device)
    with _hooks(model, timer):
        for _ in range(repeats):
            run_samples(model, samples, device)
    total = timer.inclusive.get("", 0.0) or sum(timer.own.values()) or 1e-12
    kinds = {name: type(m).__name__ for name, m in model.named_modules()}
    modules = [ModuleTime(name or "(model)", kinds[name], 1, timer.calls[name] // repeats,
                          1e3 * timer.inclusive[name] / repeats, 1e3 * timer.own[name] / repeats,
                          timer.inclusive[name] / total, timer.own[name] / total)
               for name in timer.inclusive]
    modules.sort(key=lambda m: -m.inclusive_ms)
    return Ranking(1e3 * total / repeats, repeats, tuple(modules))


def grouped(ranking: Ranking) -> Ranking:
    """The ranking with repeated structures (``layers.*.mlp``) summed under one pattern."""
    groups: dict[str, list[ModuleTime]] = {}
    for m in ranking.modules:
        groups.setdefault(group_name(m.name) if m.name != "(model)" else m.name, []).append(m)
    merged = [ModuleTime(
        name, ms[0].kind if len({m.kind for m in ms}) == 1 else "mixed", len(ms),
        sum(m.calls for m in ms), sum(m.inclusive_ms for m in ms), sum(m.self_ms for m in ms),
        sum(m.inclusive_share for m in ms), sum(m.self_share for m in ms))
        for name, ms in groups.items()]
    merged.sort(key=lambda m: -m.inclusive_ms)
    return Ranking(ranking.total_ms, ranking.repeats, tuple(merged))


def rank(target: nn.Module, samples: Sequence[Sample], *, repeats: int = 3,
         group: bool = True, top: int | None = None) -> Ranking:
    """Modules of ``target`` by their share of forward time, grouped and cut to ``top``."""
    ranking = time_modules(target, samples, repeats)
    ranking = grouped(ranking) if group else ranking
    if top is not None:
        ranking = Ranking(ranking.total_ms, ranking.repeats, ranking.modules[:top])
    return ranking
