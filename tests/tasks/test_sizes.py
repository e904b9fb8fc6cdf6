"""A task at a reduced size: which constants scale, how they are rewritten, and the search
(run in an interpreter of its own, on ``meta``) on tasks written here and KernelBench rows."""

from __future__ import annotations

from pathlib import Path

import pytest

from cuda_agent.tasks import load_task
from cuda_agent.tasks.size_search import measure
from cuda_agent.tasks.sizes import (
    SizeBudget,
    reduced_task,
    scalable_constants,
    size_task,
    with_sizes,
)
from cuda_agent.tasks.task import Task, TaskError, check_source

CONV = '''
import torch
import torch.nn as nn

batch_size = 8
channels = 4
kernel = 9
size = 16
FLAG = True
NAME = "conv"
DOUBLE = size * 2
dim = 1


class Model(nn.Module):
    def __init__(self, channels, kernel):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, kernel)

    def forward(self, x):
        return self.conv(x).softmax(dim)


def get_inputs():
    return [torch.rand(batch_size, channels, size, size)]


def get_init_inputs():
    return [channels, kernel]
'''
MiB = 2**20


def budget(cap_bytes: int, fit_bytes: int | None = None, always: bool = True,
           cap_flops: float = 1e15) -> SizeBudget:
    return SizeBudget(fit_bytes=fit_bytes, cap_bytes=cap_bytes, cap_flops=cap_flops,
                      always=always, limit_bytes=4 << 30)


def test_only_module_level_integer_literals_and_their_arithmetic_scale():
    found = scalable_constants(CONV + "N = 2048 * 2\nM = 2 ** 10 - 1\nK = 1 << 12\n"
                               "BIG = 2 ** 100\n")
    assert found == {"batch_size": 8, "channels": 4, "kernel": 9, "size": 16,
                     "N": 4096, "M": 1023, "K": 4096}  # not a bool, a string, a derived
    # one, 1 or 2 ** 100


def test_rewriting_changes_the_named_constants_and_what_follows_them():
    namespace: dict = {}
    exec(with_sizes(CONV, {"size": 12, "batch_size": 2}), namespace)
    assert (namespace["size"], namespace["DOUBLE"], namespace["batch_size"]) == (12, 24, 2)
    assert tuple(namespace["get_inputs"]()[0].shape) == (2, 4, 12, 12)
    with pytest.raises(TaskError, match="no module-level constant nope"):
        with_sizes(CONV, {"nope": 1})


def test_the_largest_constant_is_halved_and_one_that_breaks_the_task_is_left_alone():
    """``size`` 16 -> 8 would make the 9-wide kernel larger than its input, and ``kernel``
    9 -> 4 a larger output: both stay, and the largest of the others is halved instead
    (the first declared among equals) until the call is within the cap."""
    task = Task(name="conv", code=CONV)
    full = measure(CONV)
    sizing = size_task(task, budget(cap_bytes=full.bytes // 4))
    assert sizing.full == full and sizing.reached
    assert [(c.name, c.full, c.judged) for c in sizing.changes] == [
        ("batch_size", 8, 2), ("channels", 4, 2)]
    assert sizing.judged.bytes <= full.bytes // 4
    reduced = reduced_task(task, sizing)
    check_source(reduced.code, "reduced")
    assert reduced.sha256 != task.sha256 and reduced.name == task.name
    assert measure(reduced.code) == sizing.judged
    assert sizing.describe() == "batch_size 8->2, channels 4->2"


def test_a_task_that_fits_keeps_its_size_unless_asked():
    task = Task(name="conv", code=CONV)
    kept = size_task(task, budget(cap_bytes=1024, fit_bytes=1 << 40, always=False))
    assert not kept.reduced and kept.reached and kept.judged == kept.full
    assert reduced_task(task, kept) is task
    asked = size_task(task, budget(cap_bytes=1024, fit_bytes=1 << 40, always=True))
    assert asked.reduced


def test_the_flop_cap_reduces_a_small_but_costly_call():
    matmul = ("import torch\nimport torch.nn as nn\nN = 1024\n\nclass Model(nn.Module):\n"
              "    def forward(self, a, b):\n        return a @ b\n\n"
              "def get_inputs():\n    return [torch.rand(N, N), torch.rand(N, N)]\n\n"
              "def get_init_inputs():\n    return []\n")
    sizing = size_task(Task(name="mm", code=matmul), budget(cap_bytes=1 << 40, cap_flops=2e8))
    assert sizing.full.flops == 2 * 1024**3
    assert [(c.name, c.judged) for c in sizing.changes] == [("N", 256)]
    assert sizing.judged.flops <= 2e8


def test_sizes_in_literals_cannot_be_reduced_and_the_sizing_says_so():
    code = CONV.replace("torch.rand(batch_size, channels, size, size)",
                        "torch.rand(4096, 4, 4096, 4096)")
    sizing = size_task(Task(name="literal", code=code), budget(cap_bytes=MiB, always=False,
                                                               fit_bytes=MiB))
    assert not sizing.reached and not sizing.reduced  # halving `channels` breaks the conv


def test_a_task_that_does_not_run_is_a_task_error():
    broken = CONV.replace("return [channels, kernel]", "return [channels, undefined]")
    with pytest.raises(TaskError, match="does not run on the meta device: NameError"):
        size_task(Task(name="broken", code=broken), budget(cap_bytes=MiB))


@pytest.mark.parametrize(("selector", "changed"), [
    ("1/19", {"dim": (393216, 6144)}),
    ("1/1", {"N": (4096, 1024)}),
    ("1/50", {"batch_size": (256, 16)}),
])
def test_kernelbench_rows_shrink_within_the_caps(kernelbench: Path, selector: str,
                                                 changed: dict):
    task = load_task(f"{kernelbench}::{selector}")
    sizing = size_task(task, budget(cap_bytes=256 * MiB, cap_flops=4e9, fit_bytes=800 * MiB,
                                    always=False) if selector == "1/19" else
                       budget(cap_bytes=256 * MiB, cap_flops=4e9))
    assert {c.name: (c.full, c.judged) for c in sizing.changes} == changed
    assert sizing.reached and sizing.judged.bytes <= 256 * MiB
    check_source(reduced_task(task, sizing).code, selector)
