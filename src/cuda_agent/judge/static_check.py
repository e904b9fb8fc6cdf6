"""Fast source checks of a candidate's ``model_new.py`` before anything runs (judge-v3).

They give clear messages for the common rule breaks; the run-time trace in
``cuda_agent.judge.guard`` is what enforces the rules.
"""

from __future__ import annotations

import ast

CREATION = frozenset({"empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones",
                      "ones_like", "full", "full_like", "Size", "device", "get_default_dtype",
                      "is_tensor", "no_grad", "inference_mode"})
COMPUTE_METHODS = frozenset({
    "add", "sub", "mul", "div", "matmul", "mm", "bmm", "sum", "mean", "max", "min", "exp",
    "log", "softmax", "log_softmax", "relu", "sigmoid", "tanh", "pow", "sqrt", "rsqrt", "abs",
    "clamp", "norm", "var", "std", "cumsum", "argmax", "argmin", "topk", "sort", "where",
    "masked_fill", "addmm", "baddbmm", "einsum", "conv1d", "conv2d", "conv3d", "linear",
    "add_", "mul_", "sub_", "div_", "clamp_", "relu_", "exp_", "pow_", "gelu", "silu",
})
REFERENCE_MODULES = ("model", "reference", "task")
INTROSPECTION = ("gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys._getframe",
                 "inspect.currentframe", "inspect.stack", "inspect.getouterframes",
                 "_get_current_dispatch_mode", "_python_dispatch", "sys.modules",
                 "sys.settrace", "sys.setprofile", "_DisableTorchDispatch",
                 "_disable_current_modes", "_set_dispatch_mode")
PROFILER_WORDS = ("profiler", "kineto", "cupti")
"""A candidate that could tell when the device's activity is recorded could leave work on a
private stream only in the calls that are not (``judge.activity``)."""


def check_source(source: str) -> list[str]:
    """Return rule breaks found in ``model_new.py`` (empty when none)."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        return [f"model_new.py:{exc.lineno}: syntax error: {exc.msg}"]
    problems: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in \
                REFERENCE_MODULES:
            problems.append(f"model_new.py:{node.lineno}: imports the reference module "
                            f"'{node.module}' (not allowed)")
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in REFERENCE_MODULES:
                    problems.append(f"model_new.py:{node.lineno}: imports the reference "
                                    f"module '{alias.name}' (not allowed)")
    for node in ast.walk(tree):
        name = _dotted(node) if isinstance(node, ast.Attribute) else None
        if name and any(name == bad or name.endswith("." + bad) for bad in INTROSPECTION):
            problems.append(f"model_new.py:{node.lineno}: uses {name} (not allowed: a "
                            "candidate may not introspect the judge's process)")
    problems += _profiler_references(tree)
    model_new = next((n for n in tree.body if isinstance(n, ast.ClassDef)
                      and n.name == "ModelNew"), None)
    if model_new is None:
        return problems + ["model_new.py defines no class `ModelNew`"]
    for base in model_new.bases:
        if isinstance(base, ast.Name) and base.id == "Model":
            problems.append(f"model_new.py:{model_new.lineno}: ModelNew inherits from the "
                            "reference Model (not allowed)")
    forward = next((n for n in model_new.body if isinstance(n, ast.FunctionDef)
                    and n.name == "forward"), None)
    if forward is not None:
        problems += _check_forward(forward)
    return problems


def _check_forward(forward: ast.FunctionDef) -> list[str]:
    problems = []
    for node in ast.walk(forward):
        where = f"model_new.py:{getattr(node, 'lineno', forward.lineno)}"
        if isinstance(node, ast.Try):
            problems.append(f"{where}: try/except in forward (not allowed: no fallbacks)")
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func)
        if name is None:
            continue
        parts = name.split(".")
        if parts[0] in ("F",) or name.startswith(("torch.nn.functional.", "nn.functional.")):
            problems.append(f"{where}: calls {name} (not allowed: PyTorch compute in forward)")
        elif parts[0] == "torch" and len(parts) == 2 and parts[1] not in CREATION:
            problems.append(f"{where}: calls {name} (not allowed: only tensor creation, views "
                            "and cuda_extension calls)")
        elif len(parts) >= 2 and parts[0] not in ("torch", "cuda_extension", "self") and \
                parts[-1] in COMPUTE_METHODS:
            problems.append(f"{where}: calls .{parts[-1]}() (not allowed: PyTorch compute)")
    return list(dict.fromkeys(problems))


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
