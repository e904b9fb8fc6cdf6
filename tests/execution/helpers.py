"""Small waits and process checks shared by the pool tests."""

from __future__ import annotations

import time


def wait_for(condition, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie counts as gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def check_one_worker_per_gpu(pool_type) -> None:
    """A pool of ``pool_type`` on CUDA has one worker per visible GPU and judges the built-in
    example correctly on each (two jobs per GPU)."""
    import torch

    from cuda_agent.execution.pool import PoolConfig
    from cuda_agent.judge import JudgeConfig
    from cuda_agent.results import JudgeResult
    from cuda_agent.tasks import load_task

    task = load_task("builtin:gelu_bias_scale")
    config = PoolConfig(judge=JudgeConfig(device="cuda", time=False, trials=2))
    with pool_type(config) as pool:
        assert pool.stats().workers == torch.cuda.device_count()
        jobs = [(task, "builtin:gelu_bias_scale")] * (2 * torch.cuda.device_count())
        results = pool.map(jobs, timeout=600)
    assert all(isinstance(r, JudgeResult) and r.correct for r in results), results
