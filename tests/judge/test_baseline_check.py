"""A cached baseline is held to a fresh check in every judgement that reads it
(``judge.recheck``): the rule on given times, then real judgements on the CPU with a cache
planted as a loaded machine would leave it (every time 20 x longer, as
``adversarial/test_tampering.py`` inflates it) and with an honest one."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from cuda_agent.cli.render import baseline_lines
from cuda_agent.execution.backend import judge_result
from cuda_agent.judge import Candidate, Judge, JudgeConfig
from cuda_agent.judge import baselines as cache
from cuda_agent.judge.measure import measure_baselines
from cuda_agent.judge.recheck import disagreement
from cuda_agent.judge.record import Verdict
from cuda_agent.results import TimingStats, to_dict
from cuda_agent.tasks import load_task

TASK = "builtin:gelu_bias_scale"
QUICK = JudgeConfig(device="cpu", trials=2, scales=(), time_compile=False)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A baseline cache of this test's own."""
    monkeypatch.setenv("CUDA_AGENT_HOME", str(tmp_path))
    return tmp_path


def timing(median: float, low: float, high: float) -> TimingStats:
    return TimingStats(median, low, high, median, 20, low, high, high - low)


def test_a_figure_from_another_load_disagrees_with_the_check():
    fresh = timing(1.0, 0.97, 1.04)
    inflated = timing(20.0, 19.5, 20.6)  # measured while the machine was loaded
    said = disagreement(inflated, fresh, 0.1)
    assert said is not None and "is slower than a fresh check's 1 ms" in said
    quiet = timing(0.5, 0.49, 0.51)  # measured quiet, the machine loaded now
    said = disagreement(quiet, fresh, 0.1)
    assert said is not None and "is faster than" in said


def test_times_within_their_intervals_and_the_margin_agree():
    fresh = timing(1.0, 0.9, 1.1)
    assert disagreement(timing(1.05, 1.03, 1.07), fresh, 0.1) is None
    assert disagreement(timing(1.3, 1.28, 1.32), fresh, 0.1) is None  # 1.1 x 1.1 x 1.1 > 1.28
    assert disagreement(timing(1.4, 1.38, 1.42), fresh, 0.1) is not None


def test_a_baseline_that_stays_unsettled_takes_the_milestone_away():
    made = Verdict(load_task(TASK), "cpu", 7)
    made.correct, made.doubts = True, {"eager": None, "torch.compile": None}
    made.runtime_ms, made.eager_ms, made.compile_ms = 1.0, 2.0, 2.0
    made.unsettled["eager"] = "timing unreliable against eager: measured again, ..."
    result = made.finish(0.95)
    assert result.correct and result.reward == 1
    assert result.reasons == ("timing unreliable against eager: measured again, ...",)


def test_a_cache_entry_says_when_and_where_and_a_garbled_one_is_none(home: Path):
    stamped = cache.stamp(cache.Baselines(timing(1.0, 0.9, 1.1), None, None), "cpu")
    assert stamped.measured_at and stamped.cpus and stamped.device_name.startswith("cpu:")
    cache.store("k", stamped)
    assert cache.load("k") == stamped
    (home / "baselines" / "k.json").write_text(json.dumps({"eager": {"x": 1}}))
    assert cache.load("k") is None


def _judged(config: JudgeConfig = QUICK):
    return Judge(config).judge(load_task(TASK), Candidate.from_ref(TASK, "cpu"))


def _plant(key: str, base: cache.Baselines, factor: float) -> None:
    """The cache entry rewritten with every time ``factor`` x longer."""
    eager = dataclasses.replace(base.eager, **{
        f.name: getattr(base.eager, f.name) * factor
        for f in dataclasses.fields(TimingStats) if f.name.endswith("_ms")
        and getattr(base.eager, f.name) is not None})
    cache.store(key, dataclasses.replace(base, eager=eager))


@pytest.mark.slow
def test_an_honest_cache_is_reused_and_one_planted_under_load_is_measured_again(
        home: Path):
    measured = measure_baselines(load_task(TASK), QUICK)
    cache.store(measured.key, measured.baselines)  # kept even where this machine was noisy
    honest = measured.baselines.eager
    result = _judged()
    said = result.baselines[0]
    assert said.check is not None and said.measured_at.endswith("Z") and said.cpus
    assert judge_result(to_dict(result)) == result  # travels through the pool intact
    if said.source == "remeasured":  # the shared machine's load changed in between: named
        assert any(f.startswith("baselines measured again: ") for f in result.flags), \
            result.flags
    else:
        assert [b.source for b in result.baselines] == ["cached"], result.flags
        # the cached figure, or a steady fresh check's faster one in its place (named)
        assert result.eager_ms == honest.median_ms or (
            result.eager_ms < honest.median_ms
            and any("fresh check" in f for f in result.flags)), (result.eager_ms, result.flags)
        assert baseline_lines(result)[0].startswith(f"cached (at {said.measured_at} on cpu:")

    _plant(measured.key, measured.baselines, 20.0)
    result = _judged()
    assert [b.source for b in result.baselines] == ["remeasured"], result.flags
    assert result.eager_ms < 5 * honest.median_ms, (result.eager_ms, honest.median_ms)
    assert any(f.startswith("baselines measured again: the cached eager time") and
               "is slower than a fresh check's" in f for f in result.flags), result.flags
    stored = cache.load(measured.key)
    assert stored is None or stored.eager.median_ms < 5 * honest.median_ms
