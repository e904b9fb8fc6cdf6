"""Find redundant parts of a forward pass by tracing its ATen operators on real inputs.

Three kinds, none needing a list of task names:
- an operator that returns one of its inputs unchanged (a clamp that never clamps, a
  LeakyReLU after a ReLU, a mean over a dimension of size 1);
- an operator that turns a varying input into a constant (a softmax over a dimension of
  size 1, ``x - x.max()`` over one element);
- an operator whose result never reaches the output (dead work).

Views, copies, dropout and operators whose other operand is a parameter or buffer (a
learned scale may sit at its initial value of one) are not judged.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

SKIP = {"clone", "_to_copy", "copy", "copy_", "contiguous", "lift_fresh", "lift_fresh_copy",
        "detach", "detach_copy", "alias", "alias_copy", "_unsafe_view", "expand_copy",
        "view_copy", "dropout",
        "native_dropout", "feature_dropout", "alpha_dropout", "_conj", "resolve_conj",
        "resolve_neg", "zeros_like", "ones_like", "full_like", "empty_like", "fill",
        "fill_", "zero_", "new_zeros", "new_ones", "new_full", "new_empty", "scalar_tensor",
        "empty", "empty_strided", "zeros", "ones", "full", "arange", "set_", "randn_like",
        "rand_like", "randint_like", "bernoulli_", "normal_", "uniform_", "_local_scalar_dense",
        "item", "_assert_async", "_functional_assert_async", "record_stream", "as_strided_",
        "resize_", "squeeze_", "unsqueeze_", "transpose_", "t_", "swapdims_", "swapaxes_",
        "detach_"}


@dataclasses.dataclass
class _Op:
    name: str
    deps: set[int]
    mutating: bool
    outputs: list[Any]
    judged: bool
    finding: str | None = None
    constant_outputs: list[int] = dataclasses.field(default_factory=list)


class RedundancyTracer(TorchDispatchMode):
    """Record each operator, its data dependencies and what it did to its inputs."""

    def __init__(self, state: set[int], atol: float = 1e-6, rtol: float = 1e-5):
        super().__init__()
        self.state = state  # ids of parameters and buffers
        self.atol, self.rtol = atol, rtol
        self.producer = WeakIdKeyDictionary()
        self.ops: list[_Op] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        inputs = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        schema = func._schema
        mutating = schema.is_mutable
        view = any(r.alias_info is not None for r in schema.returns) and not mutating
        judged = not view and name not in SKIP and bool(inputs)
        before = [t.clone() for t in inputs] if judged and mutating else inputs
        out = func(*args, **kwargs)
        outputs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        deps = {self.producer[t] for t in inputs if t in self.producer}
        op = _Op(name, deps, mutating, [], judged)
        index = len(self.ops)
        self.ops.append(op)
        if judged:
            self._judge(op, before, outputs)
        for t in outputs:
            self.producer[t] = index
        if mutating:
            for t in inputs:
                self.producer[t] = index
        return out

    def _judge(self, op: _Op, inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> None:
        free = [t for t in inputs if id(t) not in self.state]
        held = len(free) < len(inputs)
        for k, out in enumerate(outputs):
            if out.is_floating_point() and not held:
                for t in free:
                    if (t.shape == out.shape and t.dtype == out.dtype and out.numel() > 0
                            and torch.allclose(out, t, rtol=self.rtol, atol=self.atol)):
                        op.finding = f"{op.name} returns its input unchanged"
                        return
            if out.dtype != torch.bool and out.numel() > 1 and _constant(out) and any(
                    t.numel() > 1 and t.dtype != torch.bool and not _constant(t) for t in free):
                op.constant_outputs.append(k)
                op.outputs.append(out)

    def findings(self, final: list[torch.Tensor]) -> list[str]:
        """Redundancies found, given the tensors the forward returned."""
        live: set[int] = {self.producer[t] for t in final if t in self.producer}
        live |= {i for i, op in enumerate(self.ops) if op.mutating}
        stack = list(live)
        while stack:
            for dep in self.ops[stack.pop()].deps:
                if dep not in live:
                    live.add(dep)
                    stack.append(dep)
        found = []
        for i, op in enumerate(self.ops):
            if op.finding and i in live:
                found.append(op.finding)
            elif op.constant_outputs and i in live:
                value = op.outputs[0].reshape(-1)[0].item()
                found.append(f"{op.name} turns a varying input into the constant {value:.4g}")
            elif op.judged and i not in live and not op.mutating:
                found.append(f"{op.name} result never reaches the output")
        return sorted(set(found), key=found.index)


def _constant(t: torch.Tensor) -> bool:
    flat = t.reshape(-1)
    if flat.is_floating_point():
        return bool(torch.all(flat == flat[0]).item()) and bool(torch.isfinite(flat[0]).item())
    return bool(torch.all(flat == flat[0]).item())


def trace_redundancy(model: torch.nn.Module, inputs: list, atol: float, rtol: float
                     ) -> list[str]:
    """Run ``model(*inputs)`` under the tracer and return its redundancy findings."""
    state = {id(t) for t in [*model.parameters(), *model.buffers()]}
    tracer = RedundancyTracer(state, atol=atol, rtol=rtol)
    with torch.no_grad(), tracer:
        out = model(*inputs)
    final = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
    return tracer.findings(final)


def unchanged_statements(model: torch.nn.Module, inputs: list) -> list[str]:
    """Statements of ``model.forward`` that bind a new tensor equal (bit-exact, same shape
    and dtype) to a tensor that was already there: an operator that leaves its input as it
    was (``torch.chain_matmul`` of one matrix, ``squeeze`` without a size-1 dimension, a
    pad by zero), which the ATen trace misses where it runs as a copy or a view. Found by
    watching the forward's local variables line by line (``sys.settrace``)."""
    import linecache
    import sys

    code = type(model).forward.__code__
    found: list[str] = []
    before: dict[str, tuple[torch.Tensor, int]] = {}
    line = [0]

    def tensors(frame) -> dict[str, torch.Tensor]:
        return {k: v for k, v in frame.f_locals.items() if isinstance(v, torch.Tensor)}

    def compare(new: list[torch.Tensor]) -> None:
        for value in new:
            for old, version in before.values():
                if (old is not value and old._version == version and old.shape == value.shape
                        and old.dtype == value.dtype and torch.equal(old, value)):
                    text = linecache.getline(code.co_filename, line[0]).strip()
                    found.append(f"`{text or f'line {line[0]}'}` returns its input unchanged")
                    return

    def local(frame, event, arg):
        if event in ("line", "return") and line[0]:
            held = {id(t) for t, _ in before.values()}
            new = [v for v in tensors(frame).values() if id(v) not in held]
            if event == "return":
                new += [t for t in tree_leaves(arg) if isinstance(t, torch.Tensor)
                        and id(t) not in held]
            compare(new)
        before.clear()
        before.update({k: (v, v._version) for k, v in tensors(frame).items()})
        line[0] = frame.f_lineno
        return local

    def calls(frame, event, arg):
        return local if event == "call" and frame.f_code is code else None

    previous = sys.gettrace()
    sys.settrace(calls)
    try:
        with torch.no_grad():
            model(*inputs)
    finally:
        sys.settrace(previous)
    return sorted(set(found), key=found.index)
