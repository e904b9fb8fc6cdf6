"""The judge pool with real worker processes on the CPU: honest jobs complete, a killed
worker is replaced and its job retried, a hung worker is replaced and its job fails with the
reason, and nothing is left running after ``close()``."""

from __future__ import annotations

import os
import signal

import pytest

from cuda_agent.execution import JobFailed, JudgePool, PoolConfig
from cuda_agent.judge import JudgeConfig
from cuda_agent.procs import descendants
from cuda_agent.results import JudgeResult
from cuda_agent.tasks import load_task
from cuda_agent.workspace import init_workspace
from tests.conftest import SCALE_ADD_TASK, write_solution
from tests.execution.helpers import alive, check_one_worker_per_gpu, wait_for

FAST = JudgeConfig(device="cpu", time=False, trials=2, scales=())


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory):
    """The scale_add task and its honest CPU workspace, made once (workspaces take seconds)."""
    folder = tmp_path_factory.mktemp("pool")
    (folder / "scale_add.py").write_text(SCALE_ADD_TASK)
    task = load_task(folder / "scale_add.py")
    root = init_workspace(task, folder / "ws", "cpu")
    write_solution(root)
    return task, root


@pytest.mark.slow
def test_honest_jobs_on_two_cpu_workers(job):
    task, root = job
    with JudgePool(PoolConfig(gpus=[], cpu_workers=2, judge=FAST)) as pool:
        results = pool.map([(task, root)] * 4, timeout=120)
        stats = pool.stats()
    assert all(isinstance(r, JudgeResult) for r in results), results
    assert all(r.correct and r.reward >= 1 for r in results), [r.reasons for r in results]
    assert (stats.workers, stats.done, stats.failed, stats.replaced) == (2, 4, 0, 0)
    assert (stats.queued, stats.running) == (0, 0)


def test_killed_worker_is_replaced_and_job_retried(job):
    task, root = job
    with JudgePool(PoolConfig(gpus=[], judge=FAST, retries=1)) as pool:
        handle = pool.submit(task, root, _debug_sleep_s=1.0)
        wait_for(lambda: handle.worker_pid is not None)
        first = handle.worker_pid
        os.kill(first, signal.SIGKILL)
        result = handle.result(timeout=120)
        stats = pool.stats()
        assert first not in pool.worker_pids()
    assert isinstance(result, JudgeResult) and result.correct, result
    assert handle.attempts == 2
    assert (stats.done, stats.failed, stats.replaced) == (1, 0, 1)


def test_hung_worker_is_replaced_and_job_fails_with_reason(job):
    task, root = job
    config = PoolConfig(gpus=[], judge=FAST, retries=1, job_timeout_s=1.5)
    with JudgePool(config) as pool:
        hung = pool.submit(task, root, _debug_sleep_s=60)
        failed = hung.result(timeout=120)
        stats = pool.stats()
        pids = pool.worker_pids()
        assert len(pids) == 1 and alive(pids[0])  # the replacement
    assert isinstance(failed, JobFailed) and failed.attempts == 2
    assert "worker hung" in failed.reason and "after 2 attempts" in failed.reason
    assert (stats.done, stats.failed, stats.replaced) == (0, 1, 2)


def test_close_kills_workers_and_their_children_and_fails_pending_jobs(job):
    task, root = job
    pool = JudgePool(PoolConfig(gpus=[], judge=FAST))
    handles = [pool.submit(task, root) for _ in range(2)]
    wait_for(lambda: handles[0].worker_pid is not None)
    pid = handles[0].worker_pid
    wait_for(lambda: len(descendants(pid)) >= 2)  # the judge's own worker processes
    tree = [pid, *descendants(pid)]
    pool.close()
    results = [h.result(timeout=5) for h in handles]
    assert all(isinstance(r, JobFailed) and r.reason == "pool closed" for r in results)
    wait_for(lambda: not any(alive(p) for p in tree), timeout_s=10)
    with pytest.raises(RuntimeError, match="closed"):
        pool.submit(task, root)


def test_cuda_judge_without_gpus_is_refused():
    with pytest.raises(ValueError, match="no GPU"):
        JudgePool(PoolConfig(gpus=[], judge=JudgeConfig(device="cuda")))


@pytest.mark.gpu
def test_one_worker_per_visible_gpu():
    check_one_worker_per_gpu(JudgePool)


@pytest.mark.gpu
def test_several_jobs_per_gpu_take_turns_on_it():
    """Three workers on GPU 0 share its lock: every job is judged correct and timed, each
    ran its reference, candidate and comparisons inside its GPU turn, and held it exclusive
    for part of that (its timed calls). Two candidate processes a job, so that the six
    jobs, whose timed phases take turns, fit the test's time."""
    task = load_task("builtin:gelu_bias_scale")
    judge = JudgeConfig(device="cuda", candidate_processes=2, baseline_processes=2)
    config = PoolConfig(gpus=[0], jobs_per_gpu=3, judge=judge)
    with JudgePool(config) as pool:
        assert pool.stats().workers == 3
        results = pool.map([(task, "builtin:gelu_bias_scale")] * 6, timeout=900)
    for result in results:
        assert isinstance(result, JudgeResult) and result.correct, result
        phases = dict(result.phases)
        # the candidate's process is covered from its start to its death, by a hold or by
        # waiting for one (a step up to exclusive waits while other judges hold it shared)
        assert result.runtime_ms
        assert phases["gpu_held"] + phases["gpu_wait"] >= phases["candidate"]
        assert 0 < phases["gpu_exclusive"] < phases["gpu_held"]
