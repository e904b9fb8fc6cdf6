"""The rules composer makes readable KernelBench-format tasks that load and run."""

from __future__ import annotations

import random
from collections import Counter

from cuda_agent.synth.catalog import load_catalog
from cuda_agent.synth.compose import RulesComposer, sample_count
from cuda_agent.synth.config import PAPER_OPS_MIX, ComposerConfig
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
