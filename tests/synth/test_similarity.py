"""Normalised-AST similarity, duplicate keys and size shrinking."""

from __future__ import annotations

from cuda_agent.synth.shrink import constants, shrink_code
from cuda_agent.synth.similarity import KernelBenchIndex, normalise, similarity, structure_key
from tests.synth.conftest import GOOD, task


def test_renaming_sizes_and_docstrings_do_not_matter():
    other = ('"""doc"""\n' + GOOD.replace("x", "inp").replace("256", "999")
             .replace("return torch", "# comment\n        return torch"))
    assert structure_key(other) == structure_key(GOOD)
    assert structure_key(task("return torch.sigmoid(x)")) != structure_key(GOOD)


def test_statement_splitting_and_api_spelling_normalise_away():
    a = task("return torch.relu(x)")
    b = task("y = self.act(x)\nreturn y", init="        self.act = nn.ReLU()")
    assert normalise(a) == normalise(b)
    assert similarity(normalise(a), normalise(task("return torch.sigmoid(x)"))) < 0.9


def test_kernelbench_index(kernelbench):
    index = KernelBenchIndex.load(kernelbench)
    assert len(index.entries) >= 250
    score, label = index.best(task("return torch.relu(x)"))
    assert score > 0.9 and label.endswith("19_ReLU")
    assert index.best(GOOD)[0] <= 0.9


def test_shrink_reduces_module_constants():
    code = task("return torch.softmax(x, dim=1)", inputs="torch.randn(batch_size, dim)")
    code += "\nbatch_size = 4096\ndim = 393216\nshape = (64, 128)\n"
    shrunk, changed = shrink_code(code, 1 << 16)
    assert changed["batch_size"][0] == 4096 and changed["batch_size"][1] == 2
    values = {k: v for k, (_, v) in constants(shrunk).items()}
    assert values["batch_size"] * values["dim"] <= 1 << 16
    assert values["shape"] == (64, 128)  # not needed to fit
