"""The search of ``tasks.sizes``, run in an interpreter of its own: it executes the task's
code, on the ``meta`` device where the code allows, under an address-space limit.

    python -m cuda_agent.tasks.size_search TASK_FILE BUDGET_JSON   # prints a JSON sizing
"""

from __future__ import annotations

import contextlib
import json
import resource
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from cuda_agent.results import SizeChange
from cuda_agent.tasks.sizes import (
    MAX_STEPS,
    CallSize,
    SizeBudget,
    Sizing,
    scalable_constants,
    with_sizes,
)


def measure(code: str, count_flops: bool = True) -> CallSize | str:
    """One call of the task at ``code``'s sizes, or why it does not run. Counting its
    floating-point operations costs a second or two the first time (torch's flop counter
    sets itself up), so a task that only needs its bytes known is measured without."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    namespace: dict[str, Any] = {"__name__": "task_under_sizing"}
    try:
        exec(compile(code, "model.py", "exec"), namespace)
        inputs = list(_on_meta(namespace["get_inputs"]))
        model = _on_meta(lambda: namespace["Model"](*namespace["get_init_inputs"]()))
    except Exception as exc:  # the task's own code failed at this size
        return f"{type(exc).__name__}: {exc}"
    tensors = [x for x in inputs if isinstance(x, torch.Tensor)]
    in_bytes = sum(_nbytes(x) for x in tensors)
    weights = sum(_nbytes(t) for t in (*model.parameters(), *model.buffers())) \
        if isinstance(model, torch.nn.Module) else 0
    try:
        counter = FlopCounterMode(display=False) if count_flops else None
        with torch.device("meta"), counter or contextlib.nullcontext():
            model.to("meta")
            out = model(*[x.to("meta") if isinstance(x, torch.Tensor) else x
                          for x in inputs])
        outs = out if isinstance(out, (tuple, list)) else [out]
        out_bytes = sum(_nbytes(o) for o in outs if isinstance(o, torch.Tensor))
        flops = int(counter.get_total_flops()) if counter is not None else None
    except Exception:  # an operator without a meta kernel, or a size forward refuses
        return CallSize(bytes=2 * in_bytes + weights, flops=None, ran=False)
    return CallSize(bytes=in_bytes + out_bytes + weights, flops=flops)


def search(code: str, budget: SizeBudget) -> Sizing | str:
    """The size to judge the task at (module docstring of ``tasks.sizes``), or why the
    task cannot be measured."""
    full = measure(code, count_flops=budget.always)
    if isinstance(full, str):
        return f"the task does not run on the meta device: {full}"
    if not budget.always and (budget.fit_bytes is None or full.bytes <= budget.fit_bytes):
        return Sizing(full=full, judged=full, changes=(), reached=True)
    if not budget.always:
        full = measure(code)
        if isinstance(full, str):
            return f"the task does not run on the meta device: {full}"
    cap = budget.cap_bytes if budget.fit_bytes is None else min(budget.cap_bytes,
                                                                budget.fit_bytes)

    def within(size: CallSize) -> bool:
        return size.bytes <= cap and (size.flops is None or size.flops <= budget.cap_flops)

    original = scalable_constants(code)
    values, size, settled = dict(original), full, set()
    for _ in range(MAX_STEPS):
        if within(size):
            break
        open_ = [n for n in values if n not in settled and values[n] >= 2]
        if not open_:
            break
        name = max(open_, key=lambda n: values[n])  # the first declared among equals
        trial = {**values, name: values[name] // 2}
        got = measure(with_sizes(code, _changed(original, trial)))
        if isinstance(got, str) or (full.ran and not got.ran) or not _smaller(got, size):
            settled.add(name)  # halving it breaks the task or shrinks nothing
            continue
        values, size = trial, got
    changes = tuple(SizeChange(n, original[n], values[n]) for n in original
                    if values[n] != original[n])
    return Sizing(full=full, judged=size, changes=changes, reached=within(size))


def _changed(original: dict[str, int], values: dict[str, int]) -> dict[str, int]:
    return {n: v for n, v in values.items() if v != original[n]}


def _smaller(new: CallSize, old: CallSize) -> bool:
    """Whether ``new`` is no larger than ``old`` in bytes and operations, and smaller in one
    (a halving that shrinks one while growing the other is no step towards the budget)."""
    counted = new.flops is not None and old.flops is not None
    if new.bytes > old.bytes or (counted and new.flops > old.flops):
        return False
    return new.bytes < old.bytes or (counted and new.flops < old.flops)


def _on_meta(make: Any) -> Any:
    """``make()`` with tensors created on ``meta`` (no memory); plainly where that fails
    (the address-space limit then stops an allocation too large)."""
    import torch

    try:
        with torch.device("meta"):
            return make()
    except Exception:
        return make()


def _nbytes(tensor: Any) -> int:
    return tensor.numel() * tensor.element_size()


def main(path: str, budget_json: str) -> None:
    budget = SizeBudget(**json.loads(budget_json))
    if budget.limit_bytes is not None:
        resource.setrlimit(resource.RLIMIT_AS, (budget.limit_bytes, budget.limit_bytes))
    found = search(Path(path).read_text(), budget)
    print(json.dumps({"error": found} if isinstance(found, str) else asdict(found)))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
