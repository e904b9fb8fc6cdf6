"""The seed crawler finds and confirms operators; the shipped catalog covers torch widely."""

from __future__ import annotations

import pytest

from cuda_agent.synth import crawl_hf
from cuda_agent.synth.catalog import coverage, load_catalog
from cuda_agent.synth.crawl import _run_chunk, crawl_names, torch_candidates


def test_shipped_catalog_coverage():
    ops = load_catalog()
    cov = coverage(ops)
    assert cov["found"] >= 700 and cov["works"] >= 500 and cov["composable"] >= 450
    assert cov["by_source"]["torch"]["ok"] >= 400
    for tag in ("elementwise", "reduction", "matmul", "conv", "norm", "stochastic"):
        assert cov["tags"][tag] > 0, tag
    names = [op.op for op in ops]
    assert names == sorted(names) and len(names) == len(set(names))  # deterministic order


def test_enumeration_finds_hundreds_of_torch_operators():
    names = [name for name, _ in torch_candidates()]
    assert len(names) >= 600
    assert {"nn.Conv2d", "F.gelu", "torch.diag", "nn.BatchNorm3d"} <= set(names)
    assert not any(n.startswith(("torch.zeros", "torch.manual_seed", "torch.set_"))
                   for n in names)


def test_crawler_confirms_by_execution_and_tags():
    got = {op.op: op for op in crawl_names(
        ["nn.Conv2d", "F.gelu", "torch.sum", "torch.matmul", "nn.Dropout", "nn.LayerNorm",
         "torch.no_such_op"])}
    conv = got["nn.Conv2d"]
    assert conv.status == "ok" and conv.ranks == (4,) and conv.params["in_channels"] == "$1"
    assert "conv" in conv.tags and conv.out_example == (2, 16, 14, 14)
    assert "elementwise" in got["F.gelu"].tags and got["F.gelu"].rule == "same"
    assert "reduction" in got["torch.sum"].tags
    assert "matmul" in got["torch.matmul"].tags
    assert "stochastic" in got["nn.Dropout"].tags and not got["nn.Dropout"].usable
    assert "norm" in got["nn.LayerNorm"].tags
    assert got["torch.no_such_op"].status == "failed"


def test_crawl_chunk_runs_in_a_subprocess():
    got = _run_chunk(["torch.tanh", "nn.ReLU"], timeout_s=120)
    assert got["torch.tanh"].status == "ok" and got["nn.ReLU"].status == "ok"


@pytest.mark.skipif(not crawl_hf.available(), reason="transformers not installed")
def test_transformers_blocks_from_configs():
    got = {op.op: op for op in crawl_names(["transformers.LlamaRMSNorm",
                                            "transformers.act.gelu_new"])}
    assert got["transformers.LlamaRMSNorm"].status == "ok"
    assert got["transformers.LlamaRMSNorm"].source == "transformers"
    assert "elementwise" in got["transformers.act.gelu_new"].tags
