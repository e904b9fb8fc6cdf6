"""Tasks that declare several input shapes: the shapes a user's model really sees.

A task may define, at module level, ``INPUT_SHAPES``: a literal mapping from a shape's name
to overrides of the task's own module-level size constants::

    BATCH = 2
    SEQ = 16
    INPUT_SHAPES = {"s16": {"SEQ": 16}, "s128": {"SEQ": 128}, "b8": {"BATCH": 8, "SEQ": 128}}

The first entry is the primary shape. ``with_shape`` rewrites the constants' assignments for
one entry (and drops ``INPUT_SHAPES``), giving an ordinary single-shape task the judge can run;
the judge runs every entry and reports correctness and time per shape (a kernel specialised
to one shape is caught there). Nothing here runs the task's code.
"""

from __future__ import annotations

import ast
from typing import Any

from cuda_agent.tasks.task import TaskError

SHAPES_NAME = "INPUT_SHAPES"


def _constants(tree: ast.Module) -> dict[str, ast.Assign]:
    """Module-level ``NAME = value`` assignments (single target)."""
    found: dict[str, ast.Assign] = {}
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)):
            found[node.targets[0].id] = node
    return found


def input_shapes(code: str, where: str = "task") -> dict[str, dict[str, Any]]:
    """The task's declared shapes, in order; ``{}`` when it declares none.

    Raises ``TaskError`` when ``INPUT_SHAPES`` is not a literal mapping of names to
    overrides of existing module-level constants.
    """
    try:
        tree = ast.parse(code)
    except SyntaxError as exc:
        raise TaskError(f"{where}:{exc.lineno}: syntax error: {exc.msg}") from None
    constants = _constants(tree)
    node = constants.get(SHAPES_NAME)
    if node is None:
        return {}
    try:
        shapes = ast.literal_eval(node.value)
    except (ValueError, SyntaxError):
        raise TaskError(f"{where}:{node.lineno}: {SHAPES_NAME} must be a literal dict, e.g. "
                        '{"small": {"SEQ": 16}, "large": {"SEQ": 512}}') from None
    if not isinstance(shapes, dict) or not shapes:
        raise TaskError(f"{where}:{node.lineno}: {SHAPES_NAME} must be a non-empty dict of "
                        "shape name -> {CONSTANT: value}")
    for name, overrides in shapes.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise TaskError(f"{where}:{node.lineno}: shape name {name!r} must be an identifier")
        if not isinstance(overrides, dict):
            raise TaskError(f"{where}:{node.lineno}: shape {name!r} must map constant names "
                            f"to values, not {type(overrides).__name__}")
        for constant in overrides:
            if constant == SHAPES_NAME or constant not in constants:
                raise TaskError(f"{where}:{node.lineno}: shape {name!r} overrides {constant!r}, "
                                "which is not a module-level constant of the task")
    return shapes


def with_shape(code: str, name: str) -> str:
    """The task's code at shape ``name``: a single-shape task (no ``INPUT_SHAPES``)."""
    shapes = input_shapes(code)
    if name not in shapes:
        known = ", ".join(shapes) or "none declared"
        raise TaskError(f"no input shape {name!r} in the task (shapes: {known})")
    tree = ast.parse(code)
    constants = _constants(tree)
    for constant, value in shapes[name].items():
        assign = constants[constant]
        assign.value = ast.copy_location(ast.parse(repr(value), mode="eval").body, assign.value)
    tree.body = [n for n in tree.body if n is not constants[SHAPES_NAME]]
    return f"# input shape {name!r} of a task with {len(shapes)} shapes\n{ast.unparse(tree)}\n"


def shape_tasks(task: Any) -> list[tuple[str, Any]]:
    """``(name, task at that shape)`` for each declared shape of a ``Task``; ``[]`` if none."""
    return [(name, task.model_copy(update={"code": with_shape(task.code, name)}))
            for name in input_shapes(task.code, task.source or task.name)]
