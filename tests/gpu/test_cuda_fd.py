"""Lent device packs (``cuda-fd``) on a real GPU: memory the judge exports is written by a
worker in its own pid namespace and read here after it exited; what does not fit, or is
described falsely, is refused or falls back; and the judge, confined, gives the same verdict
with either pack. Run on a GPU machine with ``pytest -m gpu tests/gpu/test_cuda_fd.py``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cuda_agent.execution.sandbox_local import confine_argv, namespace_prefix, namespaces_work
from cuda_agent.judge import device_pack, shared_pack
from cuda_agent.judge.confine import confinement
from cuda_agent.judge.cuda_vmm import DeviceMemory
from cuda_agent.judge.transport import TransportError, open_pack, unpack

pytestmark = pytest.mark.gpu

WORKER = """
import json, sys, torch
from cuda_agent.judge import device_pack
from cuda_agent.judge.transport import Packer
job = json.loads(sys.argv[1])
torch.cuda.init()
device_pack.receive(job)
if job["mode"] == "past-end":
    memory, why = device_pack.imported()
    class Wide:  # twice the lent range: what lies past it is not the judge's
        __cuda_array_interface__ = {"shape": (2 * memory.size,), "typestr": "|u1",
                                    "data": (memory.pointer, False), "version": 2}
    memory.tensor().fill_(3)
    torch.cuda.synchronize()
    torch.as_tensor(Wide()).fill_(1)
    torch.cuda.synchronize()
    sys.exit(0)
packer = Packer(None, "cuda", "cuda-fd")
outs = [torch.arange(n, device="cuda", dtype=torch.float32) * (k + 1)
        for k, n in enumerate(job["sizes"])]
descriptors = packer.add(outs)
print(json.dumps({"pack": packer.finish(), "descriptors": descriptors,
                  "fallback": packer.fallback}))
"""


def _expected(sizes: list[int]) -> list[torch.Tensor]:
    return [torch.arange(n, device="cuda", dtype=torch.float32) * (k + 1)
            for k, n in enumerate(sizes)]


def _worker(tmp_path: Path, memory: DeviceMemory, job: dict
            ) -> tuple[subprocess.CompletedProcess, int]:
    """Run WORKER (confined where namespaces can be made) lent ``memory``; it has exited
    when this returns. Returns its outcome and the memory file it could fall back to."""
    judge_end, worker_end = device_pack.channel()
    memfd = shared_pack.create(1 << 30)
    job = {**job, "pack_bytes": memory.size, "pack_device": memory.device}
    argv = [sys.executable, "-c", WORKER, json.dumps(job)]
    prefix, confine = namespace_prefix(network=False), confinement("auto")
    if prefix is not None and confine is not None:
        argv = confine_argv(prefix, tmp_path, list(confine.keep), init=True) + argv
    env = {**os.environ, device_pack.ENV_SOCK: str(worker_end.fileno()),
           shared_pack.ENV_FD: str(memfd)}
    if os.environ.get("PYTHONPATH"):  # the worker runs in another folder: no relative paths
        env["PYTHONPATH"] = os.pathsep.join(
            os.path.abspath(p) for p in os.environ["PYTHONPATH"].split(os.pathsep) if p)
    try:
        device_pack.send(judge_end, memory)
        done = subprocess.run(argv, pass_fds=(worker_end.fileno(), memfd), env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=300)
    finally:
        judge_end.close()
        worker_end.close()
    return done, memfd


def test_a_worker_in_its_own_pid_namespace_writes_the_lent_memory(tmp_path: Path):
    sizes = [1000, 5000, 123]
    memory = DeviceMemory.create(1 << 20, torch.cuda.current_device())
    done, memfd = _worker(tmp_path, memory, {"mode": "pack", "sizes": sizes})
    try:
        assert done.returncode == 0, done.stderr[-3000:]
        said = json.loads(done.stdout.splitlines()[-1])
        assert said["fallback"] is None and said["pack"]["kind"] == "cuda-fd", done.stderr
        buffer = open_pack(said["pack"], tmp_path, "cuda", "cuda-fd", memfd, memory)
        assert buffer.data_ptr() == memory.pointer  # read in place
        for got, want in zip(unpack(buffer, said["descriptors"]), _expected(sizes),
                             strict=True):
            assert torch.equal(got, want)
        with pytest.raises(TransportError, match="larger than"):
            open_pack({**said["pack"], "size": memory.size + 1}, tmp_path, "cuda", "cuda-fd",
                      memfd, memory)
        with pytest.raises(TransportError, match="do not fit"):
            unpack(buffer, [{**said["descriptors"][0], "offset": said["pack"]["size"]}])
    finally:
        os.close(memfd)


def test_outputs_outgrowing_the_lent_memory_come_back_in_the_memory_file(tmp_path: Path):
    memory = DeviceMemory.create(1, torch.cuda.current_device())  # one granule
    sizes = [1000, memory.size // 4 + 1]  # the second one no longer fits
    done, memfd = _worker(tmp_path, memory, {"mode": "pack", "sizes": sizes})
    try:
        assert done.returncode == 0, done.stderr[-3000:]
        said = json.loads(done.stdout.splitlines()[-1])
        assert said["pack"]["kind"] == "memfd" and "exceed the device pack" in said["fallback"]
        buffer = open_pack(said["pack"], tmp_path, "cuda", "cuda-fd", memfd, memory)
        for got, want in zip(unpack(buffer, said["descriptors"]), _expected(sizes),
                             strict=True):
            assert torch.equal(got, want)
    finally:
        os.close(memfd)


def test_writes_past_the_lent_memory_leave_the_judge_healthy(tmp_path: Path):
    memory = DeviceMemory.create(1, torch.cuda.current_device())
    done, memfd = _worker(tmp_path, memory, {"mode": "past-end"})
    os.close(memfd)
    # whether the worker faulted or wrote its own memory, this process is unaffected
    view = memory.tensor()
    assert int(view[:16].min()) in (1, 3)
    assert float(torch.ones(3, device="cuda").sum()) == 3.0, done.stderr[-2000:]


def test_lent_memory_is_freed_with_its_last_tensor():
    ordinal = torch.cuda.current_device()
    torch.cuda.synchronize()
    before = torch.cuda.mem_get_info(ordinal)[0]
    memory = DeviceMemory.create(256 << 20, ordinal)
    view = memory.tensor()[:1024]
    view.fill_(9)
    assert torch.cuda.mem_get_info(ordinal)[0] <= before - (256 << 20)
    assert memory.fd is not None
    memory.close_fd()
    assert memory.fd is None
    del memory
    assert int(view.sum()) == 9 * 1024  # the tensor keeps the mapping alive
    del view
    assert torch.cuda.mem_get_info(ordinal)[0] >= before - (8 << 20)


@pytest.mark.skipif(not namespaces_work(), reason="confine='on' needs namespaces")
def test_the_confined_judge_uses_the_lent_pack_and_gives_the_same_verdict(monkeypatch):
    from cuda_agent.judge import Candidate, Judge, JudgeConfig
    from cuda_agent.judge import plan as plan_module
    from cuda_agent.tasks import load_task

    seen: list[tuple[str, str]] = []
    real = plan_module.open_pack

    def spy(pack, folder, device, kind=None, *rest):
        seen.append((kind, pack.get("kind") if isinstance(pack, dict) else None))
        return real(pack, folder, device, kind, *rest)

    monkeypatch.setattr(plan_module, "open_pack", spy)
    task = load_task("builtin:gelu_bias_scale")
    config = JudgeConfig(device="cuda", confine="on", seed=1234, time_compile=False)
    results = {}
    for switch in ("1", "0"):
        monkeypatch.setenv(device_pack.ENV_SWITCH, switch)
        with Judge(config) as judge:
            candidate = Candidate.from_ref("builtin:gelu_bias_scale", "cuda")
            results[switch] = judge.judge(task, candidate)
    lent, host = results["1"], results["0"]
    assert lent.isolation == host.isolation == "namespaces"
    assert seen[-1] == ("memfd", "memfd") and ("cuda-fd", "cuda-fd") in seen, seen
    assert lent.correct and host.correct, (lent.reasons, host.reasons)
    assert (lent.correctness.max_abs_error, lent.correctness.max_rel_error) == \
        (host.correctness.max_abs_error, host.correctness.max_rel_error)
