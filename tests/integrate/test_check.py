"""Check: the whole model before and after, same outputs (nested dicts and tuples) and
both times; a wrong replacement is caught and named by its output path."""

from __future__ import annotations

from pathlib import Path

import torch
from rich.console import Console

from cuda_agent.integrate import CheckConfig, check, check_model
from cuda_agent.integrate.check import flatten
from tests.integrate.putback_fixtures import FEATURES, Net, make_result

FAST = CheckConfig(warmup=1, runs=3)


def test_check_model_same_outputs_and_times(tmp_path: Path):
    torch.manual_seed(0)
    net = Net()
    result = check_model(net, "blocks.*.act", make_result(tmp_path / "run"),
                         (torch.randn(8, FEATURES),), config=FAST)
    assert result.correct, result.reasons
    assert result.outputs == 3  # out + two hidden states
    assert result.max_abs_error < 1e-4 and result.device == "cpu"
    assert result.before.runs == result.after.runs == 3
    assert result.before.median_ms > 0 and result.after.median_ms > 0
    assert result.speedup == result.before.median_ms / result.after.median_ms
    assert result.replaced is not None and len(result.replaced.replaced) == 2
    assert type(net.blocks[0].act).__name__ == "Model"  # the user's model is untouched
    console = Console(record=True, width=120)
    console.print(result)
    text = console.export_text()
    assert "same outputs" in text and "speed-up" in text


def test_check_names_the_output_that_differs():
    torch.manual_seed(0)
    before, after = Net(), Net()
    after.load_state_dict(before.state_dict())
    with torch.no_grad():
        after.blocks[1].proj.bias.add_(1.0)
    result = check(before, after, {"x": torch.randn(2, FEATURES)}, FAST)
    assert not result.correct
    assert result.reasons[0].startswith("output.out:"), result.reasons
    assert any(r.startswith("output.hidden[1]:") for r in result.reasons)
    assert not any("hidden[0]" in r for r in result.reasons)


def test_flatten_walks_nested_outputs():
    t = torch.zeros(1)
    paths = [p for p, _ in flatten({"a": (t, [t, 3]), "b": None})]
    assert paths == ["output.a[0]", "output.a[1][0]", "output.a[1][1]", "output.b"]
