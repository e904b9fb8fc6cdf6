"""Baselines take processes while the figure needs them: a kind stops at two once their
medians agree within twice the judge's target interval, and goes to the most allowed when
they do not."""

from __future__ import annotations

import uuid

from cuda_agent.judge.measure import measure_baselines
from cuda_agent.tasks import load_task
from tests.evaluate.test_baselines import FAST
from tests.evaluate.test_run import RELU


def _eager_processes(tmp_path, target: float) -> int:
    (tmp_path / "relu.py").write_text(RELU + f"\n# {uuid.uuid4().hex}\n")
    config = FAST.model_copy(update={"baseline_processes": 4, "target_rel_ci": target,
                                     "cache_baselines": False})
    return measure_baselines(load_task(tmp_path / "relu.py"), config).baselines.eager.processes


def test_agreeing_processes_are_enough(tmp_path) -> None:
    assert _eager_processes(tmp_path, target=1.0) == 2  # any two agree within 200%


def test_disagreeing_processes_go_to_the_most_allowed(tmp_path) -> None:
    assert _eager_processes(tmp_path, target=1e-9) == 4  # no two agree within 2e-9
