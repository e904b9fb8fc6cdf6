"""The Ray judge pool on a real local Ray instance with CPU actors: results in order, a killed
actor replaced and its job retried, a hung actor replaced and its job failed with the
reason, and candidates shipped by content (the original folder may vanish after submit)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys

import pytest

from cuda_agent.execution import JobFailed, JudgeBackend, PoolConfig, RayJudgePool, make_pool
from cuda_agent.execution.pool_ray_actor import pack_candidate, unpack_candidate
from cuda_agent.judge import CandidateError, JudgeConfig
from cuda_agent.results import JudgeResult
from cuda_agent.tasks import load_task
from cuda_agent.workspace import init_workspace
from tests.conftest import SCALE_ADD_TASK, write_solution
from tests.execution.helpers import alive, check_one_worker_per_gpu, wait_for

pytest.importorskip("ray")

FAST = JudgeConfig(device="cpu", time=False, trials=2, scales=())


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory):
    """The scale_add task, its honest CPU workspace and a wrong one (same kernels, so the
    build is shared; ``alpha`` off by one)."""
    folder = tmp_path_factory.mktemp("ray-pool")
    (folder / "scale_add.py").write_text(SCALE_ADD_TASK)
    task = load_task(folder / "scale_add.py")
    root = init_workspace(task, folder / "ws", "cpu")
    write_solution(root)
    wrong = folder / "wrong"
    shutil.copytree(root, wrong)
    model = wrong / "model_new.py"
    model.write_text(model.read_text().replace("self.alpha)", "self.alpha + 1.0)"))
    return task, root, wrong


@pytest.fixture(scope="module")
def pool():
    """One CPU actor on a local Ray instance that the pool starts and stops."""
    config = PoolConfig(backend="ray", gpus=[], cpu_workers=1, judge=FAST, retries=1,
                        job_timeout_s=120)
    with make_pool(config) as pool:
        yield pool


def test_results_in_order_and_candidates_shipped_by_content(pool, job, tmp_path):
    task, root, wrong = job
    assert isinstance(pool, RayJudgePool) and isinstance(pool, JudgeBackend)
    before = pool.stats()
    copy = tmp_path / "ws"
    shutil.copytree(root, copy)
    handles = [pool.submit(task, c) for c in (copy, tmp_path / "nowhere", wrong)]
    shutil.rmtree(copy)  # the actor judges the files read at submit
    honest, missing, wrong_result = [h.result(timeout=120) for h in handles]
    stats = pool.stats()
    assert isinstance(honest, JudgeResult) and honest.correct, honest
    assert honest.reward >= 1
    assert isinstance(missing, JobFailed) and missing.attempts == 0
    assert missing.reason.startswith("candidate not shipped") and "nowhere" in missing.reason
    assert isinstance(wrong_result, JudgeResult) and not wrong_result.correct, wrong_result
    assert wrong_result.reward == -1
    assert (stats.workers, stats.done - before.done, stats.failed - before.failed) == (1, 2, 1)
    assert (stats.queued, stats.running) == (0, 0)


def test_killed_actor_is_replaced_and_job_retried(pool, job):
    task, root, _ = job
    replaced = pool.stats().replaced
    handle = pool.submit(task, root, _debug_sleep_s=1.0)
    wait_for(lambda: handle.worker_pid is not None)
    first = handle.worker_pid
    os.kill(first, signal.SIGKILL)
    result = handle.result(timeout=120)
    assert isinstance(result, JudgeResult) and result.correct, result
    assert handle.attempts == 2
    assert pool.stats().replaced == replaced + 1
    assert first not in pool.worker_pids()


def test_oversized_candidate_fails_at_once(pool, job, tmp_path):
    task, _, _ = job
    big = tmp_path / "big"
    (big / "kernels").mkdir(parents=True)
    (big / "model_new.py").write_bytes(b"#" * (5 * 2**20))
    (big / "kernels" / "pad.cu").write_bytes(b"/" * (5 * 2**20))
    failed = pool.submit(task, big).result(timeout=5)
    assert isinstance(failed, JobFailed) and failed.attempts == 0
    assert "candidate not shipped" in failed.reason and "8 MiB" in failed.reason


def test_hung_actor_is_replaced_and_job_fails_with_reason(pool, job):
    task, root, _ = job
    config = PoolConfig(gpus=[], judge=FAST, retries=0, job_timeout_s=1.5)
    with RayJudgePool(config) as hung_pool:  # joins the module pool's Ray instance
        hung = hung_pool.submit(task, root, _debug_sleep_s=60)
        wait_for(lambda: hung.worker_pid is not None)
        first = hung.worker_pid
        failed = hung.result(timeout=120)
        stats = hung_pool.stats()
    assert isinstance(failed, JobFailed) and failed.attempts == 1
    assert failed.reason == "worker hung: no result after 1.5 s (after 1 attempts)"
    assert (stats.done, stats.failed, stats.replaced) == (0, 1, 1)
    wait_for(lambda: not alive(first), timeout_s=10)
    with pytest.raises(RuntimeError, match="closed"):
        hung_pool.submit(task, root)


def test_pack_and_unpack_keep_what_the_judge_reads(job, tmp_path):
    _, root, _ = job
    copy = tmp_path / "ws"
    shutil.copytree(root, copy)
    (copy / "notes.txt").write_text("not part of the candidate")
    (copy / "kernels" / "scratch.bin").write_bytes(b"\0" * 100)
    shipped = pack_candidate(copy)
    assert shipped["kind"] == "workspace"
    kernels = {p.relative_to(copy).as_posix() for p in (copy / "kernels").iterdir()
               if p.suffix in (".cpp", ".h")}
    assert {"kernels/scale_add.cpp", "kernels/scale_add_binding.cpp"} <= kernels
    assert set(shipped["files"]) == {"model_new.py", *kernels}
    ref = unpack_candidate(shipped, tmp_path / "out")
    assert ref == str((tmp_path / "out").resolve())
    for rel in shipped["files"]:
        assert (tmp_path / "out" / rel).read_bytes() == (copy / rel).read_bytes()
    single = pack_candidate(copy / "model_new.py")
    assert single["kind"] == "file" and set(single["files"]) == {"model_new.py"}
    assert unpack_candidate(single, tmp_path / "one").endswith("model_new.py")
    assert pack_candidate("builtin:gelu_bias_scale") == {"ref": "builtin:gelu_bias_scale"}
    with pytest.raises(CandidateError, match="inside"):
        unpack_candidate({"kind": "workspace", "files": {"../escape.py": b""}}, tmp_path / "x")


def test_importing_the_package_does_not_import_ray():
    code = "import sys, cuda_agent.execution; assert 'ray' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.gpu
def test_one_actor_per_gpu():
    check_one_worker_per_gpu(RayJudgePool)
