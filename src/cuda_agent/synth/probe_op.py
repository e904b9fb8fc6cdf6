"""Confirm one operator call by execution: shapes on the meta device, then real runs.

An ``Attempt`` is a concrete way to build and call an operator (code templates plus input
specs). ``confirm`` tries it at several ranks of the first input and returns the catalog
entry: ranks that worked, the example shapes, output rule and tags found by running it
(element-wise by a one-element perturbation, stochastic by two RNG states).
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from typing import Any

from cuda_agent.synth.catalog import InputSpec, SeedOp

EXAMPLES = {4: (2, 8, 16, 16), 3: (4, 8, 32), 2: (8, 32), 5: (2, 4, 8, 8, 8), 1: (64,)}
STOCHASTIC_NAME = re.compile(r"dropout|rrelu|bernoulli|multinomial|normal|poisson|rand",
                             re.IGNORECASE)
MATMUL_NAME = re.compile(r"(^|\.|_)(mm|bmm|matmul|linear|addmm|baddbmm|addbmm|addmv|mv|dot|"
                         r"inner|outer|einsum|tensordot|chain_matmul|bilinear|kron|vdot)$|"
                         r"Linear|Bilinear|Attention|MLP", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class Attempt:
    """One way to build and call an operator; templates as in ``SeedOp``."""

    op: str
    kind: str
    call_code: str
    inputs: tuple[InputSpec, ...]
    init_code: str = ""
    params: dict[str, Any] = dataclasses.field(default_factory=dict)
    extra_init: dict[str, str] = dataclasses.field(default_factory=dict)
    imports: tuple[str, ...] = ()
    source: str = "torch"
    ranks: tuple[int, ...] = (4, 3, 2, 5, 1)


def resolve(value: Any, shape: tuple[int, ...]) -> Any:
    """Bind a ``"$k"`` parameter to dimension k of ``shape``; other values pass through."""
    if isinstance(value, str) and value.startswith("$"):
        return shape[int(value[1:])]
    return value


def render(template: str, params: dict[str, Any], **names: str) -> str:
    return template.format(**{k: repr(v) for k, v in params.items()}, **names)


def namespace(imports: tuple[str, ...]) -> dict[str, Any]:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    ns: dict[str, Any] = {"torch": torch, "nn": nn, "F": F}
    for line in imports:
        exec(line, ns)
    return ns


def make_input(spec: InputSpec, primary: tuple[int, ...], device: str = "cpu"):
    import torch

    shape = primary if spec.shape == ("like",) else tuple(resolve(d, primary) for d in spec.shape)
    dtype = getattr(torch, spec.dtype)
    if device == "meta":
        return torch.empty(shape, dtype=dtype, device="meta")
    if spec.domain.startswith("int:"):
        return torch.randint(0, int(spec.domain[4:]), shape, dtype=dtype)
    if spec.domain == "bool":
        return torch.rand(shape) > 0.5
    if spec.domain == "unit":
        return torch.rand(shape, dtype=dtype) * 0.9 + 0.05
    if spec.domain == "positive":
        return torch.rand(shape, dtype=dtype) * 2 + 0.1
    return torch.randn(shape, dtype=dtype)


def build_call(attempt: Attempt | SeedOp, primary: tuple[int, ...], device: str):
    """Return (callable, params, namespace) for an attempt or catalog entry bound to a first
    input of shape ``primary``; modules are built on ``device`` as ``mod``."""
    import torch

    ns = namespace(attempt.imports)
    params = {k: resolve(v, primary) for k, v in attempt.params.items()}
    args = [f"in{i}" for i in range(1, len(attempt.inputs))]
    names = {f"in{i}": f"in{i}" for i in range(1, len(attempt.inputs))}
    if attempt.kind == "module":
        torch.manual_seed(0)
        with torch.device(device):
            ns["mod"] = eval(render(attempt.init_code, params), ns)
            for suffix, code in attempt.extra_init.items():
                ns[f"mod_{suffix}"] = eval(render(code, params), ns)
                names[f"mod_{suffix}"] = f"mod_{suffix}"
        call = render(attempt.call_code, {}, mod="mod", x="x", **names)
    else:
        call = render(attempt.call_code, params, x="x", **names)
    fn = eval(f"lambda x, {', '.join(args)}: {call}" if args else f"lambda x: {call}", ns)
    return fn, params, ns


def first_tensor(out: Any):
    import torch

    if isinstance(out, torch.Tensor):
        return out, False
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0], True
    raise TypeError(f"returned {type(out).__name__}, not a tensor")


def run_once(attempt: Attempt, rank: int, device: str, domain: str | None = None):
    import torch

    primary = EXAMPLES[rank]
    specs = list(attempt.inputs)
    specs[0] = specs[0].model_copy(update={"shape": primary})
    if domain:
        specs = [s.model_copy(update={"domain": domain}) if s.dtype.startswith("float") else s
                 for s in specs]
    torch.manual_seed(1)
    tensors = [make_input(s, primary, device) for s in specs]
    fn, _, _ = build_call(attempt, primary, device)
    out, tupled = first_tensor(fn(*tensors))
    return fn, tensors, out, tupled, specs


def confirm(attempt: Attempt) -> SeedOp:
    """Try ``attempt`` at each rank; return the catalog entry (status 'failed' on no rank)."""
    warnings.filterwarnings("ignore")
    error, found = "", None
    ok_ranks: list[int] = []
    for rank in attempt.ranks:
        try:
            real = _confirm_rank(attempt, rank)
        except Exception as exc:  # any failure of the operator itself
            error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
            continue
        ok_ranks.append(rank)
        found = found or (rank, real)
    if found is None:
        return SeedOp(op=attempt.op, source=attempt.source, kind=attempt.kind,
                      imports=attempt.imports, init_code=attempt.init_code,
                      call_code=attempt.call_code, params=attempt.params,
                      inputs=attempt.inputs, status="failed", error=error)
    rank, (out, tupled, specs, meta_ok, tags) = found
    call = attempt.call_code + ("[0]" if tupled else "")
    x_shape = EXAMPLES[rank]
    rule = ("same" if tuple(out.shape) == x_shape else
            "reduce" if out.numel() < _numel(x_shape) else
            "expand" if out.numel() > _numel(x_shape) else "reshape")
    if not out.dtype.is_floating_point:
        tags.add("integer_output")
    if not specs[0].dtype.startswith("float"):
        tags.add("integer_input")
    return SeedOp(op=attempt.op, source=attempt.source, kind=attempt.kind,
                  imports=attempt.imports, init_code=attempt.init_code, call_code=call,
                  extra_init=attempt.extra_init,
                  params=attempt.params, inputs=(specs[0].model_copy(update={"shape": ()}),
                                                 *specs[1:]),
                  ranks=tuple(sorted(ok_ranks)), example=x_shape,
                  out_example=tuple(out.shape), out_dtype=str(out.dtype).removeprefix("torch."),
                  rule=rule, tags=tuple(sorted(tags)),
                  status="ok" if meta_ok else "no_meta")


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _confirm_rank(attempt: Attempt, rank: int):
    import torch

    try:
        _, _, meta_out, _, _ = run_once(attempt, rank, "meta")
        meta_shape = tuple(meta_out.shape)
    except Exception:
        meta_shape = None
    fn, tensors, out, tupled, specs = run_once(attempt, rank, "cpu")
    if out.numel() == 0:
        raise ValueError("empty output")
    if out.dtype.is_floating_point and not torch.isfinite(out).all():
        fn, tensors, out, tupled, specs = run_once(attempt, rank, "cpu", domain="unit")
        if not torch.isfinite(out).all():
            raise ValueError("non-finite output on normal and unit inputs")
    tags = _tags(attempt, fn, tensors, out)
    return out, tupled, specs, meta_shape == tuple(out.shape), tags


def _tags(attempt: Attempt, fn, tensors, out) -> set[str]:
    import torch

    tags: set[str] = set()
    lower = attempt.op.lower()
    torch.manual_seed(11)
    a = first_tensor(fn(*tensors))[0]
    torch.manual_seed(12)
    b = first_tensor(fn(*tensors))[0]
    if STOCHASTIC_NAME.search(attempt.op.split(".")[-1]) or not torch.equal(a, b):
        tags.add("stochastic")
    x = tensors[0]
    if out.shape == x.shape and x.dtype.is_floating_point and x.numel() > 1:
        bumped = x.clone()
        k = x.numel() // 2
        bumped.view(-1)[k] += 0.37
        moved = (first_tensor(fn(bumped, *tensors[1:]))[0] != out).view(-1)
        if moved.sum() == 1 and moved[k]:
            tags.add("elementwise")
    if "elementwise" not in tags and out.numel() < x.numel():
        tags.add("reduction")
    if MATMUL_NAME.search(attempt.op):
        tags.add("matmul")
    for word in ("conv", "norm", "pool", "loss"):
        if word in lower:
            tags.add(word)
    if "elementwise" in tags and len(tensors) == 1 and not attempt.op.startswith("torch."):
        tags.add("activation")
    return tags
