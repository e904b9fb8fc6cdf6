"""Write the starting ``model_new.py``: the reference module with ``Model`` replaced.

Imports, constants and helper classes of the reference are kept, so ``ModelNew`` can build
the same sub-modules and parameters (weights are shared through ``state_dict``);
``Model.__init__`` is copied into ``ModelNew``; ``forward`` keeps its signature and waits
for the agent's kernels. ``get_inputs`` and ``get_init_inputs`` belong to the task and are
dropped.
"""

from __future__ import annotations

import ast
import re

HEADER = '''"""ModelNew for task {name}: same constructor as Model, forward through cuda_extension.

Allowed in forward: tensor creation and views (empty, view, reshape, contiguous, ...)
and calls into cuda_extension. Build with utils/build, check with utils/verify.
"""
'''


def render_stub(code: str, task_name: str) -> str:
    """Return the source of the starting ``model_new.py`` for a task's reference code."""
    tree = ast.parse(code)
    lines = code.splitlines()
    imports, rest = [], []
    model = None
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in ("get_inputs", "get_init_inputs"):
            continue
        if isinstance(node, ast.ClassDef) and node.name == "Model":
            model = node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            imports.append(node)
        elif not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)):
            rest.append(node)
    kept = [n for n in rest if not isinstance(n, (ast.Assign, ast.AnnAssign))]
    used = {n.id for root in [*kept, model] if root for n in ast.walk(root)
            if isinstance(n, ast.Name)}
    kept_ids = {id(n) for n in kept}
    for node in rest:
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if any(isinstance(t, ast.Name) and t.id in used for t in targets):
            kept_ids.add(id(node))
    parts = [HEADER.format(name=task_name)]
    parts += [_segment(lines, n) for n in imports]
    parts.append("import cuda_extension\n")
    for node in rest:
        if id(node) in kept_ids:
            parts.append("\n" + _segment(lines, node))
    if model is not None:
        parts.append("\n" + _model_new(lines, model))
    return _tidy("\n".join(parts))


def _segment(lines: list[str], node: ast.AST) -> str:
    first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
    return "\n".join(lines[first - 1 : node.end_lineno]) + "\n"


def _model_new(source: list[str], node: ast.ClassDef) -> str:
    """Copy class ``Model`` as ``ModelNew``, every method kept but ``forward``'s body."""
    forward = next(n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "forward")
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    head = source[first - 1 : forward.body[0].lineno - 1]
    tail = source[forward.end_lineno : node.end_lineno]
    indent = " " * (forward.col_offset + 4)
    # the forward's docstring stays: it says what the computation is
    doc = forward.body[0]
    keep_doc = isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant)
    if keep_doc:
        head = source[first - 1 : doc.end_lineno]
    stub = [f"{indent}# Replace with calls to your kernels, e.g. cuda_extension.my_op(x).",
            f'{indent}raise NotImplementedError("ModelNew.forward is not written yet")']
    text = "\n".join([*head, *stub, *tail])
    text = re.sub(r"\bclass\s+Model\b", "class ModelNew", text, count=1)
    return text.replace("super(Model, self)", "super()") + "\n"


def _tidy(source: str) -> str:
    out: list[str] = []
    for line in source.splitlines():
        if not line.strip() and len(out) >= 2 and not out[-1].strip() and not out[-2].strip():
            continue
        out.append(line.rstrip())
    return "\n".join(out).strip() + "\n"
