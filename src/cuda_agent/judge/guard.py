"""Run-time enforcement inside the candidate's process (judge-v3).

``ForwardGuard`` wraps each call of ``ModelNew.forward``:

- Every ATen operator dispatched during the call is seen by a ``TorchDispatchMode``, also
  those called from C++ inside the extension (``at::matmul`` in a binding goes through the
  dispatcher). Only tensor creation, views, copies into place and fills are allowed; the
  custom kernels themselves are not ATen operators.
- Fresh allocations made during the call (``empty``, ``empty_like``, ``empty_strided``) are
  filled with NaN (floats) or a sentinel (integers) before the candidate sees them, so an
  output that is not fully written cannot pass on stale memory.
- The functions of the extension module are wrapped to record which tensors they returned
  or received; every output of ``forward`` must share storage with one of those, else it
  was not produced by a custom kernel (a decoy launch or a PyTorch result).
- Python threads that are still alive after the call are reported.
- The trusted fixed C++ layer adds a process-wide operator trace (a global RecordFunction
  callback): operators run on other threads, or with Python dispatch modes switched off,
  are seen there too.
- Reading tensor data into NumPy or Python lists (``.numpy()``, ``.tolist()``,
  ``__array__``) during the call is refused: that is computing outside a kernel.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

ALLOWED = frozenset({
    # creation
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros",
    "zeros_like", "ones", "ones_like", "full", "full_like", "new_zeros", "new_ones",
    "new_full", "scalar_tensor", "lift_fresh", "lift_fresh_copy", "zero_", "fill_",
    # views and layout
    "view", "_unsafe_view", "reshape", "as_strided", "permute", "transpose", "t", "squeeze",
    "unsqueeze", "expand", "expand_as", "flatten", "unflatten", "select", "slice",
    "narrow", "split", "split_with_sizes", "chunk", "unbind", "movedim", "alias", "detach",
    "contiguous", "clone", "copy_", "_reshape_alias", "view_as", "resize_", "set_",
    "unfold", "diagonal", "_to_copy", "to", "_local_scalar_dense", "is_nonzero", "sym_size",
    "sym_stride", "sym_numel", "sym_storage_offset", "record_stream", "resolve_conj",
    "resolve_neg", "conj", "_conj", "detach_", "is_same_size", "size", "stride", "numel",
    "dim", "item", "result_type", "is_pinned", "_has_compatible_shallow_copy_type",
})
DATA_ESCAPES = ("numpy", "tolist", "__array__", "__dlpack__", "__dlpack_device__",
                "__cuda_array_interface__", "__array_interface__")
"""Ways a tensor's data reaches Python or another library's arithmetic (NumPy, CuPy, ...):
refused while a call runs."""
POISON_OPS = frozenset({"empty", "empty_like", "empty_strided", "new_empty",
                        "new_empty_strided"})


def op_name(func: Any) -> str:
    """'aten::add.Tensor' -> 'add'; in-place variants keep their underscore."""
    return func._schema.name.split("::")[-1]


def poison(t: torch.Tensor) -> None:
    if t.numel() == 0:
        return
    with torch.no_grad():
        if t.is_floating_point() or t.is_complex():
            t.fill_(float("nan"))
        elif t.dtype == torch.bool:
            t.fill_(True)
        else:
            t.fill_(torch.iinfo(t.dtype).max if t.dtype != torch.uint8 else 0xA5)


TORCH_NAMESPACES = frozenset({"aten", "prims", "prim", "quantized", "_quantized", "c10d",
                              "c10d_functional", "_c10d_functional", "profiler", "inductor",
                              "torchvision", "_higher_order_ops", "higher_order", "mkldnn",
                              "mkl", "onednn", "xnnpack", "_nested_tensor", "sparse"})
"""Operator namespaces whose kernels are PyTorch's (or a library's shipped with it); an
operator of any other namespace was registered by the candidate's own library
(``TORCH_LIBRARY``): its kernel is the candidate's."""


class _Trace(TorchDispatchMode):
    def __init__(self, poison_fresh: bool, custom: Callable[[Any, Any, Any], None]):
        super().__init__()
        self.violations: list[str] = []
        self.poison_fresh = poison_fresh
        self.ops: dict[str, int] = {}
        self.custom = custom

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = op_name(func)
        self.ops[name] = self.ops.get(name, 0) + 1
        if func._schema.name.split("::")[0] not in TORCH_NAMESPACES:  # the candidate's op
            out = func(*args, **(kwargs or {}))
            self.custom(args, kwargs or {}, out)
            return out
        if name not in ALLOWED and name.rstrip("_") not in ALLOWED:
            full = str(func._schema.name) + (f".{func._overloadname}"
                                             if func._overloadname != "default" else "")
            if full not in self.violations:
                self.violations.append(full)
        out = func(*args, **(kwargs or {}))
        if self.poison_fresh and name in POISON_OPS and isinstance(out, torch.Tensor):
            poison(out)
        return out


class ForwardGuard:
    """Check one forward call; ``problems`` lists what broke the rules (empty if none)."""

    def __init__(self, extension_modules: list[ModuleType], tracer: ModuleType | None = None,
                 poison_fresh: bool = True):
        self.poison_fresh = poison_fresh
        self.tracer = tracer
        self.produced: set[int] = set()
        self.calls = 0
        self.started = self.inside = False
        self.outside = 0
        """Extension calls made between calls once the first began (work done before the
        judge's go, or after a call returned, where no call's time sees it)."""
        for module in extension_modules:
            self._wrap(module)

    def _wrap(self, module: ModuleType) -> None:
        if not isinstance(module, ModuleType):  # load_inline(..., is_python_module=False)
            return
        for name in dir(module):
            fn = getattr(module, name)
            if name.startswith("_") or not callable(fn) or getattr(fn, "_ca_wrapped", False):
                continue
            setattr(module, name, self._recording(fn))

    def _recording(self, fn: Callable) -> Callable:
        guard = self

        def call(*args, **kwargs):
            guard.calls += 1
            if guard.started and not guard.inside:
                guard.outside += 1
            result = fn(*args, **kwargs)
            guard._produced(args, kwargs, result)
            return result

        call._ca_wrapped = True  # type: ignore[attr-defined]
        call.__doc__ = fn.__doc__
        return call

    def _produced(self, args: Any, kwargs: dict[str, Any], result: Any) -> None:
        """The tensors a kernel of the candidate's received or returned."""
        for value in (*args, *kwargs.values(), *_flatten(result)):
            if isinstance(value, torch.Tensor):
                self.produced.add(_storage_key(value))

    def _custom(self, args: Any, kwargs: dict[str, Any], result: Any) -> None:
        """An operator the candidate's own library registered ran: a kernel of its own."""
        self.calls += 1
        self._produced(args, kwargs, result)

    def run(self, model: torch.nn.Module, inputs: list[Any]) -> tuple[Any, list[str]]:
        """Call ``model(*inputs)`` under the trace; return its result and the problems."""
        outside, self.outside = self.outside, 0
        self.started = self.inside = True
        self.produced.clear()
        self.calls = 0
        input_keys = {_storage_key(x) for x in inputs if isinstance(x, torch.Tensor)}
        trace = _Trace(self.poison_fresh, self._custom)
        saved = {name: torch.Tensor.__dict__[name] for name in DATA_ESCAPES
                 if name in torch.Tensor.__dict__}
        escapes: list[str] = []
        for name in DATA_ESCAPES:
            setattr(torch.Tensor, name, _refuse(name, escapes))
        if self.tracer is not None:
            self.tracer._trace_begin()
        try:
            with torch.no_grad(), trace:
                result = model(*inputs)
        except Exception:
            if not escapes:
                raise
            result = None
        finally:
            self.inside = False
            seen = self.tracer._trace_end() if self.tracer is not None else {}
            for name in DATA_ESCAPES:
                if name in saved:
                    setattr(torch.Tensor, name, saved[name])
                else:
                    delattr(torch.Tensor, name)
        violations = list(trace.violations)
        for full in seen:
            if full.startswith("aten::"):
                name = full.split("::", 1)[1]
                if name not in ALLOWED and name.rstrip("_") not in ALLOWED and \
                        not any(v.startswith(full) for v in violations):
                    violations.append(full)
        problems = [f"forward ran {op} (not allowed: only tensor creation, views and "
                    "cuda_extension calls)" for op in violations[:5]]
        problems += [f"forward read tensor data with .{name}() (not allowed: compute belongs "
                     "in a kernel)" for name in dict.fromkeys(escapes)]
        if self.calls == 0:
            problems.append("no custom kernel ran: forward never called the extension")
        if outside:
            problems.append(f"the extension ran {outside} time(s) between calls (not allowed: "
                            "a call's work belongs inside the call, where it is timed)")
        for k, out in enumerate(_flatten(result)):
            if not isinstance(out, torch.Tensor):
                continue
            key = _storage_key(out)
            if key not in self.produced or (key in input_keys and self.calls == 0):
                problems.append(f"output {k} was not produced by a custom kernel "
                                "(it does not come from a cuda_extension call)")
        return result, problems


def _refuse(name: str, escapes: list[str]) -> Any:
    def refused(*args, **kwargs):
        escapes.append(name)
        raise RuntimeError(f"Tensor.{name}() is not allowed inside ModelNew.forward")
    if name in ("__cuda_array_interface__", "__array_interface__"):  # properties
        return property(lambda self: refused())
    return refused


def _flatten(value: Any) -> list[Any]:
    if isinstance(value, (list, tuple)):
        return [x for item in value for x in _flatten(item)]
    return [value]


def _storage_key(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return t.data_ptr()
