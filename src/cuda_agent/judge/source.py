"""Where a timing run's calls come from, as the worker sees them (``timing.measure``).

In a judge's worker every call comes from the judge (``calls.CallChannel``): its inputs are
made from the seed the judge sends with it, into one of two buffers that alternate (so a
cache keyed by pointer serves the wrong inputs' answer), and after it returns the judge
says whether to keep it. The judge's own measurements that run no one's code (the memory
bandwidth) and tests use a local source: fresh seeds, nothing kept.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import torch

from cuda_agent.judge.calls import Call, CallChannel


class CallSource:
    """The calls of one run: ``next`` asks for one, ``fill`` makes its inputs, ``ready``
    waits for the go, ``done`` reports it returned (and hands it over if kept)."""

    def __init__(self, make: Callable[[int, float], list[Any]],
                 channel: CallChannel | None = None,
                 pack: Callable[[list[Any], Any], dict[str, Any]] | None = None,
                 finish: Callable[[Any], None] | None = None):
        self.make, self.channel = make, channel
        self._pack, self._finish = pack, finish
        self.buffers: list[list[Any]] | None = None
        self.current: Call | None = None
        self.filled = 0
        self._rng = random.Random()

    def next(self, phase: str, stop: bool = False) -> Call | None:
        """The next call of ``phase`` (``stop``: this run would end the phase), or None."""
        if self.channel is not None:
            self.current = self.channel.need(phase, stop)
        else:  # a local run owes no one calls past its own stop, and has no wall calls
            ends = stop or phase in ("calibrate", "tail", "check")
            self.current = None if ends else Call(self._rng.getrandbits(62), wall=False)
        return self.current

    @property
    def wall(self) -> bool:
        return self.current is not None and self.current.wall

    @property
    def scaled(self) -> bool:
        return self.current is not None and self.current.scale != 1.0

    def fill(self) -> list[Any]:
        """The current call's inputs, made now and copied into the next buffer."""
        call = self.current or Call(self._rng.getrandbits(62))
        return self._into_buffer(self.make(call.seed, call.scale))

    def fill_local(self) -> list[Any]:
        """Inputs from a seed of this process's own, for calls the judge does not see (the
        device timer's idle probes: no one's code runs on them)."""
        return self._into_buffer(self.make(self._rng.getrandbits(62), 1.0))

    def _into_buffer(self, variant: list[Any]) -> list[Any]:
        if self.buffers is None:
            self.buffers = [[x.clone() if isinstance(x, torch.Tensor) else x for x in variant]
                            for _ in range(2)]
        buffer = self.buffers[self.filled % 2]
        self.filled += 1
        with torch.no_grad():
            for k, (dst, src) in enumerate(zip(buffer, variant, strict=True)):
                if isinstance(dst, torch.Tensor):
                    dst.copy_(src)
                else:
                    buffer[k] = src
        return buffer

    def ready(self) -> None:
        if self.channel is not None:
            self.channel.ready()

    def done(self, inputs: list[Any], out: Any) -> None:
        """The call returned ``out``: its outputs and inputs packed (where this worker packs),
        the judge told, then ``out`` let go."""
        if self.channel is not None:
            self.channel.done(**(self._pack(inputs, out) if self._pack is not None else {}))
        if self._finish is not None:
            self._finish(out)
