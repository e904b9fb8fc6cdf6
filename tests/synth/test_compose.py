"""The rules composer makes readable KernelBench-format tasks that load and run."""

from __future__ import annotations

import random
from collections import Counter

from cuda_agent.synth.catalog import COMPUTE_HEAVY, load_catalog, op_class
from cuda_agent.synth.compose import RulesComposer, sample_count
from cuda_agent.synth.config import PAPER_OPS_MIX, ComposerConfig
from cuda_agent.synth.sizing import first_shape, realistic
from cuda_agent.tasks.inspect import inspect_task
from cuda_agent.tasks.loaders import load_tasks


def _composer(**kw) -> RulesComposer:
    return RulesComposer(load_catalog(), ComposerConfig(min_numel_cpu=4096,
                                                        max_numel_cpu=65536, **kw))


def test_composed_tasks_load_and_run(tmp_path):
    composer = _composer()
    made = [c for c in (composer.compose(seed) for seed in range(12)) if c is not None]
    assert len(made) >= 8
    for cand in made[:6]:
        path = tmp_path / f"{cand.name}.py"
        path.write_text(cand.code)
        (task,) = load_tasks(path)
        assert "def get_init_inputs" in task.code and "class Model(nn.Module)" in task.code
        assert cand.data_source == f"{cand.data_source.split('#')[0]}#{len(cand.ops)}"
    spec = inspect_task(next(iter(load_tasks(tmp_path / f"{made[0].name}.py"))))
    assert spec.outputs  # ran in a separate process


def test_composition_is_deterministic():
    composer = _composer()
    seed = next(s for s in range(50) if composer.compose(s) is not None)
    assert composer.compose(seed).code == composer.compose(seed).code
    assert composer.compose(seed, scale=4.0).code == composer.compose(seed, scale=4.0).code


def test_ops_mix_follows_config():
    rng = random.Random(0)
    counts = Counter(sample_count(rng, PAPER_OPS_MIX) for _ in range(5000))
    assert abs(counts[2] / 5000 - 0.838) < 0.03 and abs(counts[1] / 5000 - 0.034) < 0.01
    only3 = Counter(sample_count(rng, {3: 1.0}) for _ in range(100))
    assert only3 == {3: 100}


def test_transformers_share():
    composer = _composer(transformers_share=1.0, ops_mix={1: 1.0})
    cands = [c for c in (composer.compose(s) for s in range(6)) if c is not None]
    assert cands and all(c.data_source == "transformers#1" for c in cands)


def _classes(composer: RulesComposer, seeds: range) -> list[list[str]]:
    by_name = {op.op: op for op in load_catalog()}
    made = [c for c in (composer.compose(s) for s in seeds) if c is not None]
    return [[op_class(by_name[op]) for op in c.ops] for c in made]


def test_most_tasks_hold_a_compute_heavy_operator():
    tasks = _classes(_composer(), range(120))
    heavy = sum(any(c in COMPUTE_HEAVY for c in cs) for cs in tasks)
    assert len(tasks) >= 100 and heavy / len(tasks) >= 0.7
    none = _classes(_composer(compute_share=0.0, class_mix={"activation": 1.0},
                                transformers_share=0.0), range(30))
    assert none and all(set(cs) == {"activation"} for cs in none)


def test_rare_operators_are_not_drawn():
    rare = {"torch.chain_matmul", "torch.ldexp", "torch.frexp", "torch.norm_except_dim"}
    composer = _composer(class_mix={"gemm": 1.0, "elementwise": 1.0, "reduction": 1.0})
    ops = {op for s in range(150) if (c := composer.compose(s)) for op in c.ops}
    assert ops and not ops & rare
    drawn = {op.op for ops_, _ in composer.by_class.values() for op in ops_}
    assert not drawn & rare
    kept = _composer(rare_weight=1.0)
    assert rare <= {op.op for ops_, _ in kept.by_class.values() for op in ops_}


def test_first_inputs_have_model_shapes():
    config = ComposerConfig()
    composer = RulesComposer(load_catalog(), config)
    rng = random.Random(3)
    for rank in (2, 3, 4):
        for _ in range(20):
            shape = first_shape(rank, config, rng, 1 << 20)
            if rank in (2, 3):
                assert shape[-1] in config.hidden_sizes
            else:
                assert shape[1] in config.channels and shape[2] == shape[3]
    linear = next(op for op in composer.by_class["gemm"][0] if op.op == "nn.Linear")
    widths = {realistic(linear, config, random.Random(s)).params["out_features"]
              for s in range(20)}
    assert widths <= set(config.hidden_sizes) and len(widths) > 2
