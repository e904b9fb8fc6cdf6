"""Put back: ModelNew replaces every matching sub-module, with the original weights, and
bad patterns, weights, settings or folders are refused with the model left untouched."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from cuda_agent.integrate import IntegrateError, ReplaceReport, replace
from cuda_agent.integrate.load import locate
from tests.integrate.putback_fixtures import FEATURES, Net, make_result


@pytest.fixture
def result(tmp_path: Path) -> Path:
    return make_result(tmp_path / "run")


def test_replace_swaps_every_match_with_the_original_weights(result: Path):
    torch.manual_seed(0)
    net = Net()
    originals = [block.act for block in net.blocks]
    x = torch.randn(4, FEATURES)
    with torch.no_grad():
        expected = net(x)["out"]
    report = replace(net, "blocks.*.act", result)
    assert isinstance(report, ReplaceReport)
    assert [r.path for r in report.replaced] == ["blocks.0.act", "blocks.1.act"]
    assert report.kernels_device == "cpu" and report.replaced[0].dtype == "float32"
    for block, old in zip(net.blocks, originals, strict=True):
        assert type(block.act).__name__ == "ModelNew"
        torch.testing.assert_close(block.act.bias, old.bias)
    with torch.no_grad():
        torch.testing.assert_close(net(x)["out"], expected, atol=1e-5, rtol=1e-5)
    # the result/ folder alone works too when the task is given
    again = replace(Net(), "blocks.1.act", result / "result", task=result / "workspace/model.py")
    assert [r.path for r in again.replaced] == ["blocks.1.act"]


def test_a_pattern_that_matches_nothing_is_an_error(result: Path):
    net = Net()
    with pytest.raises(IntegrateError, match=r"'blocks\.\*\.mlp' matches no sub-module.*"
                                             r"blocks\.0\.act"):
        replace(net, "blocks.*.mlp", result)
    with pytest.raises(IntegrateError, match="whole model"):
        replace(net, "", result)


def test_a_key_mismatch_names_the_keys_and_leaves_the_model(result: Path):
    class Other(nn.Module):
        def __init__(self):
            super().__init__()
            self.shift = nn.Parameter(torch.zeros(FEATURES))
            self.scale = 0.5

    net = Net()
    net.blocks[1].act = Other()
    with pytest.raises(IntegrateError, match=r"missing keys.*\['bias'\].*"
                                             r"unexpected keys.*\['shift'\]"):
        replace(net, "blocks.*.act", result)
    assert type(net.blocks[0].act).__name__ == "Model"  # nothing replaced: all or none


def test_settings_that_differ_from_the_task_are_refused(result: Path):
    with pytest.raises(IntegrateError, match=r"scale: 0\.25 here, 0\.5 in ModelNew"):
        replace(Net(scale=0.25), "blocks.*.act", result)
    report = replace(Net(scale=0.25), "blocks.*.act", result, init_inputs=[FEATURES, 0.25])
    assert len(report.replaced) == 2


def test_incomplete_result_folders_are_refused(tmp_path: Path, result: Path):
    (result / "result" / "model_new.py").unlink()
    with pytest.raises(IntegrateError, match="not a result folder, model_new.py missing"):
        locate(result)
    alone = tmp_path / "alone"
    (make_result(tmp_path / "second") / "result").rename(alone)
    with pytest.raises(IntegrateError, match="task is not beside it"):
        locate(alone)
    (alone / "kernels" / "gelu_bias_scale.cpp").unlink()
    (alone / "kernels" / "gelu_bias_scale_binding.cpp").unlink()
    with pytest.raises(IntegrateError, match="holds no kernel sources"):
        locate(alone, task="builtin:gelu_bias_scale")
    with pytest.raises(IntegrateError, match="no such folder"):
        locate(tmp_path / "absent")

