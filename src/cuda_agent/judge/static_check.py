"""Fast source checks of a candidate's ``model_new.py`` before anything runs.

They give clear messages for the common rule breaks; the run-time trace in
``cuda_agent.judge.guard`` and the symbol check of built code (``cuda_agent.build.symbols``)
are what enforce the rules. A call is refused as PyTorch compute only where it statically
resolves to PyTorch: a name imported from torch (``torch.matmul``, ``F.relu``, ``matmul``
from ``from torch import matmul``), or a method of a tensor the source shows (forward's
parameters, ``self``'s parameters and buffers, views of them). A function of anything else,
an extension module named ``F`` or a binding named ``mm`` included, is left to the trace.
Anywhere in the file, the routes to native code or the judge that no trace follows are
refused: ``ctypes``, ``cffi``, ``importlib``, ``__import__``, ``exec``/``eval``/``compile``,
other programs (``os.system``, ``subprocess``), ``mmap``, the judge's package.
"""

from __future__ import annotations

import ast

CREATION = frozenset({
    "empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "ones_like", "full",
    "full_like", "tensor", "as_tensor", "Size", "device", "dtype", "finfo", "iinfo",
    "get_default_dtype", "is_tensor", "is_floating_point", "is_complex", "promote_types",
    "result_type", "no_grad", "inference_mode", "set_grad_enabled", "is_grad_enabled",
    # views and layout, as the run-time guard allows them
    "reshape", "flatten", "unflatten", "squeeze", "unsqueeze", "transpose", "permute", "t",
    "narrow", "select", "split", "chunk", "unbind", "movedim", "as_strided", "view_as_real",
    "view_as_complex"})
COMPUTE_METHODS = frozenset({
    "add", "sub", "mul", "div", "matmul", "mm", "bmm", "mv", "dot", "outer", "sum", "mean",
    "prod", "max", "min", "amax", "amin", "exp", "log", "log1p", "expm1", "softmax",
    "log_softmax", "relu", "sigmoid", "tanh", "pow", "sqrt", "rsqrt", "abs", "neg", "square",
    "reciprocal", "clamp", "norm", "var", "std", "cumsum", "cumprod", "logsumexp", "argmax",
    "argmin", "topk", "sort", "where", "masked_fill", "addmm", "addcmul", "addcdiv",
    "baddbmm", "einsum", "conv1d", "conv2d", "conv3d", "linear", "gelu", "silu", "erf",
    "sin", "cos", "floor", "ceil", "round", "lerp", "add_", "mul_", "sub_", "div_", "clamp_",
    "relu_", "exp_", "pow_", "addmm_", "addcmul_", "lerp_"})
TENSOR_METHODS = COMPUTE_METHODS | {
    "view", "view_as", "reshape", "reshape_as", "contiguous", "transpose", "permute", "t",
    "squeeze", "unsqueeze", "flatten", "unflatten", "expand", "expand_as", "narrow", "select",
    "as_strided", "movedim", "diagonal", "unfold", "split", "chunk", "unbind", "clone",
    "detach", "to", "float", "double", "half", "bfloat16", "int", "long", "cuda", "cpu",
    "type_as", "new_empty", "new_zeros", "new_ones", "new_full", "zero_", "fill_", "copy_"}
"""Methods of a tensor that return a tensor (or tensors), for following views."""
TENSOR_ATTRIBUTES = frozenset({"T", "mT", "H", "mH", "real", "imag", "data"})
TORCH_COMPUTE = ("torch.nn.functional.", "torch.special.", "torch.linalg.", "torch.fft.",
                 "torch.sparse.", "torch.ops.aten.", "torch._C._nn.", "torch._C._linalg.",
                 "torch._C._fft.", "torch._C._special.", "torch._C._VariableFunctions.",
                 "torch._refs.", "torch._prims.")
HARMLESS_MODULES = frozenset({"Identity", "Flatten", "Unflatten", "ModuleList", "ModuleDict",
                              "Sequential", "ParameterList", "ParameterDict"})
REFERENCE_MODULES = ("model", "reference", "task")
INTROSPECTION = ("gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys._getframe",
                 "inspect.currentframe", "inspect.stack", "inspect.getouterframes",
                 "_get_current_dispatch_mode", "_python_dispatch", "sys.modules",
                 "sys.settrace", "sys.setprofile", "_DisableTorchDispatch",
                 "_disable_current_modes", "_set_dispatch_mode")
FRAME_ATTRIBUTES = frozenset({"__traceback__", "tb_frame", "tb_next", "f_back", "f_locals",
                              "f_globals", "f_builtins", "gi_frame", "cr_frame", "ag_frame"})
"""Attributes that lead from the candidate's own code to the frames of the judge's code that
called it (and its locals)."""
PROFILER_WORDS = ("profiler", "kineto", "cupti")
"""A candidate that could tell when the device's activity is recorded could leave work on a
private stream only in the calls that are not (``judge.activity``)."""

NATIVE = "loads or calls native code that the judge neither built nor checked"
ARITHMETIC = "another library's arithmetic: the work belongs in the candidate's own kernels"
OTHER_LIBRARIES = ("scipy", "cupy", "cupyx", "numba", "jax", "jaxlib", "tensorflow", "sklearn",
                   "cv2", "numexpr")
"""Array libraries a candidate has no use for. NumPy may be imported (tasks use it for
constants); a tensor's data cannot reach it during a call (``guard.DATA_ESCAPES``)."""
BY_NAME = "imports modules by computed names, which no check can follow"
PROGRAMS = "starts other programs or processes"
ROUTE_MODULES = {
    "ctypes": NATIVE, "_ctypes": NATIVE, "cffi": NATIVE, "_cffi_backend": NATIVE,
    "importlib": BY_NAME, "builtins": "reaches exec, eval and __import__ by other names",
    "subprocess": PROGRAMS, "_posixsubprocess": PROGRAMS,
    "mmap": "maps files or executable memory outside any tensor",
    "cuda_agent": "the judge's own package is out of a candidate's reach",
    **{name: ARITHMETIC for name in OTHER_LIBRARIES},
}
ROUTE_BUILTINS = {"exec": "runs code built from strings, which no check can read",
                  "eval": "runs code built from strings, which no check can read",
                  "compile": "runs code built from strings, which no check can read",
                  "__import__": BY_NAME, "__builtins__": ROUTE_MODULES["builtins"]}
ROUTE_CALLS = {"torch.ops.load_library": NATIVE, "torch.classes.load_library": NATIVE,
               "torch._C._dlopen": NATIVE}
ROUTE_PREFIXES = {"torch._C": "torch's internals (which switch its traces off) are the judge's",
                  "torch.library": "operators defined in Python run outside every trace",
                  "torch._dynamo": "compiles PyTorch code, which is not the candidate's",
                  "torch.compile": "compiles PyTorch code, which is not the candidate's",
                  "numpy.ctypeslib": NATIVE}
PROCESS_FUNCTIONS = ("system", "popen", "fork", "forkpty", "exec", "spawn", "posix_spawn")


def check_source(source: str) -> list[str]:
    """Return rule breaks found in ``model_new.py`` (empty when none)."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        return [f"model_new.py:{exc.lineno}: syntax error: {exc.msg}"]
    aliases = _aliases(tree)
    problems: list[str] = []
    for node in ast.walk(tree):
        for module in _imported(node):
            if module.split(".")[0] in REFERENCE_MODULES:
                problems.append(f"model_new.py:{node.lineno}: imports the reference module "
                                f"'{module}' (not allowed)")
    for node in ast.walk(tree):
        name = _dotted(node) if isinstance(node, ast.Attribute) else None
        names = {name, _resolve(node, aliases)} - {None} if name else set()
        hit = next((n for n in sorted(names) for bad in INTROSPECTION
                    if n == bad or n.endswith("." + bad)), None)
        if hit:
            problems.append(f"model_new.py:{node.lineno}: uses {name} (not allowed: a "
                            "candidate may not introspect the judge's process)")
        elif isinstance(node, ast.Attribute) and node.attr in FRAME_ATTRIBUTES:
            problems.append(f"model_new.py:{node.lineno}: uses .{node.attr} (not allowed: a "
                            "candidate may not reach the frames of the code that calls it)")
    problems += _routes(tree, aliases)
    problems += _profiler_references(tree)
    model_new = next((n for n in tree.body if isinstance(n, ast.ClassDef)
                      and n.name == "ModelNew"), None)
    if model_new is None:
        return list(dict.fromkeys(problems + ["model_new.py defines no class `ModelNew`"]))
    for base in model_new.bases:
        if isinstance(base, ast.Name) and base.id == "Model":
            problems.append(f"model_new.py:{model_new.lineno}: ModelNew inherits from the "
                            "reference Model (not allowed)")
    forward = next((n for n in model_new.body if isinstance(n, ast.FunctionDef)
                    and n.name == "forward"), None)
    if forward is not None:
        problems += _Forward(model_new, forward, aliases).problems()
    return list(dict.fromkeys(problems))


def _routes(tree: ast.Module, aliases: dict[str, str]) -> list[str]:
    """Imports, builtins and calls that reach native code, other programs or the judge."""
    problems = []
    bound = _bound_names(tree)
    for node in ast.walk(tree):
        where = f"model_new.py:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import | ast.ImportFrom):
            for module in _imported(node):
                reason = ROUTE_MODULES.get(module.split(".")[0])
                if reason:
                    problems.append(f"{where}: imports {module} (not allowed: {reason})")
            if isinstance(node, ast.ImportFrom) and node.module:
                paths = [f"{node.module}.{alias.name}" for alias in node.names]
            else:
                continue
        elif isinstance(node, ast.Name) and node.id in ROUTE_BUILTINS and node.id not in bound:
            problems.append(f"{where}: uses {node.id} (not allowed: "
                            f"{ROUTE_BUILTINS[node.id]})")
            continue
        elif isinstance(node, ast.Attribute | ast.Name):
            paths = [_resolve(node, aliases) or ""]
        else:
            continue
        for path in paths:
            reason = _route(path)
            if reason:
                problems.append(f"{where}: uses {path} (not allowed: {reason})")
    return problems


def _route(path: str) -> str | None:
    """Why the dotted ``path`` is a route no trace follows, or None."""
    module, _, function = path.rpartition(".")
    if path in ROUTE_CALLS:
        return ROUTE_CALLS[path]
    for prefix, reason in ROUTE_PREFIXES.items():
        if path == prefix or path.startswith(prefix + "."):
            return reason
    if module in ("os", "posix") and function.startswith(PROCESS_FUNCTIONS):
        return PROGRAMS
    return None


class _Forward:
    """What ``ModelNew.forward`` calls that statically resolves to PyTorch compute."""

    def __init__(self, model_new: ast.ClassDef, forward: ast.FunctionDef,
                 aliases: dict[str, str]):
        self.forward, self.aliases = forward, aliases
        self.tensor_attrs, self.torch_modules = _attributes(model_new, aliases)
        args = forward.args
        self.tensors = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs][1:]}
        self.tensors |= {a.arg for a in (args.vararg,) if a is not None}
        grown = True
        while grown:  # names assigned a view (or any tensor) of a known tensor
            before = len(self.tensors)
            for node in ast.walk(forward):
                if isinstance(node, ast.Assign) and self.is_tensor(node.value):
                    for target in node.targets:
                        for leaf in ast.walk(target):
                            if isinstance(leaf, ast.Name):
                                self.tensors.add(leaf.id)
            grown = len(self.tensors) > before

    def problems(self) -> list[str]:
        problems = []
        for node in ast.walk(self.forward):
            where = f"model_new.py:{getattr(node, 'lineno', self.forward.lineno)}"
            if isinstance(node, ast.Try):
                problems.append(f"{where}: try/except in forward (not allowed: no fallbacks)")
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name, resolved = _dotted(func), _resolve(func, self.aliases)
            torch_call = _torch_compute(resolved) if resolved else None
            if torch_call:
                shown = name if name == resolved else f"{name} = {resolved}"
                problems.append(f"{where}: calls {shown} (not allowed: {torch_call})")
            elif isinstance(func, ast.Attribute) and func.attr in COMPUTE_METHODS and \
                    self.is_tensor(func.value):
                problems.append(f"{where}: calls .{func.attr}() on a tensor (not allowed: "
                                "PyTorch compute)")
            elif isinstance(func, ast.Attribute) and _is_self(func.value) and \
                    self.torch_modules.get(func.attr, "Identity") not in HARMLESS_MODULES:
                problems.append(f"{where}: calls self.{func.attr}, a torch.nn."
                                f"{self.torch_modules[func.attr]} (not allowed: PyTorch "
                                "compute)")
        return problems

    def is_tensor(self, node: ast.AST) -> bool:
        """Whether the source shows ``node`` is a tensor (or a tuple of tensors)."""
        if isinstance(node, ast.Name):
            return node.id in self.tensors
        if isinstance(node, ast.Subscript):
            return self.is_tensor(node.value)
        if isinstance(node, ast.Attribute):
            if _is_self(node.value):
                return node.attr in self.tensor_attrs
            if isinstance(node.value, ast.Attribute) and _is_self(node.value.value) and \
                    node.value.attr in self.torch_modules:
                return node.attr in ("weight", "bias")
            return node.attr in TENSOR_ATTRIBUTES and self.is_tensor(node.value)
        if isinstance(node, ast.Call):
            if isinstance(node.func, ast.Attribute) and node.func.attr in TENSOR_METHODS and \
                    self.is_tensor(node.func.value):
                return True
            resolved = _resolve(node.func, self.aliases) or ""
            return resolved.count(".") == 1 and resolved.startswith("torch.")
        return False


def _torch_compute(resolved: str) -> str | None:
    """Why a call of ``resolved`` (a dotted name from torch) is PyTorch compute, or None."""
    parts = resolved.split(".")
    if parts[0] != "torch":
        return None
    if resolved.startswith(TORCH_COMPUTE):
        return "PyTorch compute in forward"
    if len(parts) == 2 and parts[1] not in CREATION:
        return "only tensor creation, views and cuda_extension calls"
    if parts[:2] == ["torch", "Tensor"] and parts[-1] in COMPUTE_METHODS:
        return "PyTorch compute in forward"
    return None


def _attributes(model_new: ast.ClassDef, aliases: dict[str, str]
                ) -> tuple[set[str], dict[str, str]]:
    """``self``'s tensors (parameters, buffers, torch-made tensors) and its torch.nn
    modules (name -> class), as ModelNew's methods assign them."""
    tensors: set[str] = set()
    modules: dict[str, str] = {}
    for node in ast.walk(model_new):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                _is_self(node.func.value) and node.func.attr == "register_buffer" and \
                node.args and isinstance(node.args[0], ast.Constant):
            tensors.add(str(node.args[0].value))
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)):
            continue
        made = _resolve(node.value.func, aliases) or ""
        for target in node.targets:
            if not (isinstance(target, ast.Attribute) and _is_self(target.value)):
                continue
            if made in ("torch.nn.Parameter", "torch.nn.parameter.Parameter") or \
                    made.count(".") == 1 and made.startswith("torch."):
                tensors.add(target.attr)
            elif made.startswith("torch.nn.") and made.count(".") == 2:
                modules[target.attr] = made.rsplit(".", 1)[1]
    return tensors, modules


def _aliases(tree: ast.Module) -> dict[str, str]:
    """Names the module imports -> the dotted path they stand for (``F`` ->
    ``torch.nn.functional``, ``matmul`` -> ``torch.matmul``), unless a name is also bound
    some other way (``F = load_inline(...)``)."""
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    aliases[alias.asname] = alias.name
                else:
                    aliases[alias.name.split(".")[0]] = alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    bound = _bound_names(tree)
    return {name: path for name, path in aliases.items() if name not in bound}


def _bound_names(tree: ast.Module) -> set[str]:
    """Names bound other than by an import: assigned, defined, parameters, targets."""
    bound = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del):
            bound.add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    return bound


def _resolve(node: ast.AST, aliases: dict[str, str]) -> str | None:
    """The dotted path ``node`` stands for through the module's imports, or None."""
    name = _dotted(node)
    if name is None:
        return None
    head, _, rest = name.partition(".")
    if head not in aliases:
        return None
    return aliases[head] + (f".{rest}" if rest else "")


def _imported(node: ast.AST) -> list[str]:
    """The modules an import statement names (none for other nodes)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    return [node.module or ""] if isinstance(node, ast.ImportFrom) else []


def _is_self(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id == "self"


def _profiler_references(tree: ast.Module) -> list[str]:
    """Imports, attributes and name-like strings that mention the profiler or the device's
    activity API (prose in strings and names of one's own variables pass)."""
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            words = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            words = [node.module or ""] + [alias.name for alias in node.names]
        elif isinstance(node, ast.Attribute):
            words = [node.attr]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str | bytes):
            text = (node.value.decode("latin-1") if isinstance(node.value, bytes)
                    else node.value)
            name_like = text.strip() and not any(c.isspace() for c in text.strip())
            words = [text] if name_like or any(w in text.lower() for w in ("cupti", "kineto"))\
                else []
        else:
            continue
        hit = next((w for w in words if any(p in w.lower() for p in PROFILER_WORDS)), None)
        if hit is not None:
            problems.append(f"model_new.py:{node.lineno}: refers to '{hit[:60]}' (not allowed: "
                            "a candidate may not look at how the judge records the device)")
    return problems


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None
