"""Tasks declaring several input shapes: parsing, rewriting, and clear errors."""

from __future__ import annotations

import pytest

from cuda_agent.tasks.shapes import input_shapes, with_shape
from cuda_agent.tasks.task import TaskError

TASK = '''
import torch
BATCH = 2
SEQ = 16
INPUT_SHAPES = {"s16": {"SEQ": 16}, "s128": {"SEQ": 128, "BATCH": 4}}

def get_inputs():
    return [torch.randn(BATCH, SEQ)]
'''


def test_shapes_are_read_in_order_and_rewritten():
    assert list(input_shapes(TASK)) == ["s16", "s128"]
    assert input_shapes("X = 1\n") == {}
    namespace: dict = {}
    exec(with_shape(TASK, "s128"), namespace)
    assert (namespace["BATCH"], namespace["SEQ"]) == (4, 128)
    assert "INPUT_SHAPES" not in namespace  # a single-shape task
    assert tuple(namespace["get_inputs"]()[0].shape) == (4, 128)
    exec(with_shape(TASK, "s16"), namespace)
    assert (namespace["BATCH"], namespace["SEQ"]) == (2, 16)


@pytest.mark.parametrize(("declaration", "message"), [
    ('INPUT_SHAPES = {"a": {"HIDDEN": 3}}', "'HIDDEN', which is not a module-level constant"),
    ("INPUT_SHAPES = make_shapes()", "must be a literal dict"),
    ("INPUT_SHAPES = {}", "non-empty dict"),
    ('INPUT_SHAPES = {"1x": {"SEQ": 3}}', "must be an identifier"),
    ('INPUT_SHAPES = {"a": [1, 2]}', "must map constant names to values"),
])
def test_bad_declarations_are_named(declaration: str, message: str):
    code = TASK.replace('INPUT_SHAPES = {"s16": {"SEQ": 16}, "s128": {"SEQ": 128, "BATCH": 4}}',
                        declaration)
    with pytest.raises(TaskError, match=message.replace("(", r"\(")):
        input_shapes(code, "t.py")


def test_unknown_shape_lists_the_known_ones():
    with pytest.raises(TaskError, match=r"no input shape 'big' .*s16, s128"):
        with_shape(TASK, "big")
