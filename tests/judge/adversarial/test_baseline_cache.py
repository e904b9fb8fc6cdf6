"""Cached baselines against load that comes and goes (docs/judge.md, "Cached baselines").

A cache entry is written under one load and read under another; the fresh check is meant to
tell. These tests make the load differ between the check and the candidate's own timing
(load while the check runs, none while the candidate is timed, as another judgement's
candidate beside this one, or any other process, can make it), and between the cached
figure and the check (a steady figure slowed by an earlier load)."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cuda_agent.judge import Candidate, Judge, JudgeConfig
from cuda_agent.judge import baselines as cache
from cuda_agent.judge.baselines import Baselines
from cuda_agent.judge.measure import baseline_key, measure_baselines
from cuda_agent.judge.recheck import confirmed, disagreement
from cuda_agent.judge.trust import problems
from cuda_agent.results import JudgeResult, TimingStats
from cuda_agent.tasks import load_task
from tests.judge.test_trust import HOG

TASK = "builtin:gelu_bias_scale"
QUICK = JudgeConfig(device="cpu", trials=2, scales=(), time_compile=False)

pytestmark = pytest.mark.slow


def steady(median: float, rel: float = 0.02) -> TimingStats:
    """A time of ``median`` ms with a narrow interval (``rel`` of it each side), its judge's
    clock agreeing: what the cache keeps (only steady figures are stored)."""
    low, high = median * (1 - rel), median * (1 + rel)
    return TimingStats(median, low, high, median, 50, low, high, high - low, clock_ms=median,
                       clock_ci_low_ms=low, clock_ci_high_ms=high)


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> JudgeConfig:
    """``QUICK`` with a baseline cache of this test's own; the kernel's build comes from the
    session's cache (the build is not what is tested)."""
    from cuda_agent.paths import home_dir

    build = QUICK.build.model_copy(update={"cache_dir": str(home_dir() / "build")})
    monkeypatch.setenv("CUDA_AGENT_HOME", str(tmp_path / "home"))
    return QUICK.model_copy(update={"build": build})


def judged(config: JudgeConfig) -> JudgeResult:
    return Judge(config).judge(load_task(TASK), Candidate.from_ref(TASK, "cpu"))




@contextlib.contextmanager
def load_until_first_exclusive_turn(turn: Path, per_cpu: int = 3) -> Iterator[list[str]]:
    """Busy processes from now until the first exclusive hold of the GPU turn at ``turn``
    ends (on a judgement reading cached baselines: the fresh check's timed calls); this
    thread then holds the turn shared until they are dead, so the next timed phase (the
    candidate's) runs on a quiet machine. Yields a list that gets "checked under load"
    once the hold was seen."""
    turn.touch()
    procs = [subprocess.Popen([sys.executable, "-c", HOG], stdout=subprocess.DEVNULL)
             for _ in range(per_cpu * len(os.sched_getaffinity(0)))]
    seen: list[str] = []
    done = threading.Event()

    def watch() -> None:
        fd = os.open(turn, os.O_RDWR)
        try:
            while not done.is_set():
                try:
                    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                except BlockingIOError:
                    break  # exclusive: the check's calls are being timed
                fcntl.flock(fd, fcntl.LOCK_UN)
                time.sleep(0.001)
            else:
                return
            fcntl.flock(fd, fcntl.LOCK_SH)  # its hold is over
            seen.append("checked under load")
            for proc in procs:
                proc.kill()
                proc.wait()
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield seen
    finally:
        done.set()
        watcher.join(30)
        for proc in procs:
            proc.kill()
            proc.wait()


def test_a_check_made_under_load_confirms_no_cached_figure(config: JudgeConfig,
                                                           tmp_path: Path):
    """A steady eager figure 1.8 x the machine's is in the cache (as a steady loaded
    stretch leaves it). The machine is loaded in bursts while the fresh check times the
    reference's calls and quiet from then on, when the candidate is timed: the check's
    interval is so wide that, each widened by 10%, it overlaps the entry, which is used as
    confirmed. A check too unsteady to tell the entry from the machine's time must not
    count as one (or the speed-up over it must not count)."""
    honest = measure_baselines(load_task(TASK), config).baselines
    assert honest.eager is not None
    cache.store(baseline_key(load_task(TASK), config, "cpu"),
                dataclasses.replace(honest, eager=steady(1.8 * honest.eager.median_ms)))
    turn = tmp_path / "turn"
    with load_until_first_exclusive_turn(turn) as seen:
        result = judged(config.model_copy(update={"gpu_lock": str(turn)}))
    assert seen, "the check's exclusive hold was never seen"
    assert result.correct, result.reasons
    source = result.baselines[0]
    doubted = any(r.startswith("timing unreliable against eager") for r in result.reasons)
    unsteady = problems("the check", source.check, result.time_meaning, config)
    assert source.source != "cached" or doubted or not unsteady, (
        f"cached eager {result.eager_ms:.4g} ms (the machine's {honest.eager.median_ms:.4g} "
        f"ms) confirmed by a check of {source.check.median_ms:.4g} ms "
        f"({source.check.ci_low_ms:.4g}-{source.check.ci_high_ms:.4g}): {unsteady}; "
        f"reward {result.reward}")


def test_a_steady_check_lowers_a_steady_figure_a_quarter_too_slow():
    """On given times: a check within the noise rule's bound (±10%) and a cached figure 30%
    slower, both steady, agree (each interval widened by 10% on top of its own width); a
    candidate no faster than eager would be 1.3x faster than the cached figure, intervals
    apart: reward 2. The faster of the two eager times is used, torch.compile's scaled with
    it, so no speed-up is counted that the check does not show; a check slower than the cache
    (this judgement's own load) lowers nothing."""
    fresh = steady(1.0, 0.09)
    cached = Baselines(steady(1.3), steady(0.65), None)
    assert disagreement(cached.eager, fresh, QUICK.trusted_rel_ci) is None  # they agree
    used, note = confirmed(cached, fresh)
    assert used.eager == fresh and note is not None and "fresh check" in note
    assert used.compile is not None and abs(used.compile.median_ms - 0.5) < 1e-9
    assert abs(used.compile.ci_high_ms - 0.5 * 1.02) < 1e-9
    slower = steady(1.4)
    assert confirmed(cached, slower) == (cached, None)
