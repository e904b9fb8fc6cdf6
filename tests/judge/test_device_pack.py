"""Lent device packs (``cuda-fd``) without a GPU: which kind the judge names and why, the
worker's fall-back to the memory file, the checks on what the worker describes, and the
descriptor's way into a confined worker. tests/gpu/test_cuda_fd.py runs the real thing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from cuda_agent.execution.sandbox_local import namespaces_work
from cuda_agent.judge import cuda_driver, device_pack, shared_pack
from cuda_agent.judge.transport import Packer, TransportError, aligned, open_pack, unpack


class FakeMemory:
    """Stands in for ``cuda_vmm.DeviceMemory``: host memory, the same interface."""

    def __init__(self, size: int):
        self.size, self.device = size, 0
        self.buffer = torch.zeros(size, dtype=torch.uint8)

    def tensor(self) -> torch.Tensor:
        return self.buffer


@pytest.fixture
def memfd(monkeypatch: pytest.MonkeyPatch):
    fd = shared_pack.create(1 << 20)
    monkeypatch.setenv(shared_pack.ENV_FD, str(fd))
    yield fd
    os.close(fd)


def _lend(monkeypatch: pytest.MonkeyPatch, memory: FakeMemory | None, why: str = "") -> None:
    monkeypatch.setattr(device_pack, "imported", lambda: (memory, why))


def test_without_a_driver_the_judge_names_memfd_with_the_reason(monkeypatch):
    def no_library(*args, **kwargs):
        raise OSError("libcuda.so.1: cannot open shared object file")

    cuda_driver.driver.cache_clear()
    monkeypatch.setattr(cuda_driver.ctypes, "CDLL", no_library)
    try:
        offer = device_pack.offer("cuda", 1 << 30)
    finally:
        cuda_driver.driver.cache_clear()
    assert (offer.kind, offer.memory) == ("memfd", None)
    assert "no CUDA driver (libcuda.so.1)" in offer.reason


def test_the_judge_names_memfd_where_a_device_pack_does_not_fit_or_is_off(monkeypatch):
    assert "not a CUDA device" in device_pack.offer("cpu", 1 << 20).reason
    assert "no reference outputs" in device_pack.offer("cuda", None).reason
    monkeypatch.setenv(device_pack.ENV_SWITCH, "0")
    assert "turned off" in device_pack.offer("cuda", 1 << 20).reason
    monkeypatch.delenv(device_pack.ENV_SWITCH)
    monkeypatch.setattr(cuda_driver, "driver", lambda: None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(cuda_driver, "free_bytes", lambda ordinal: 3 << 30)
    offer = device_pack.offer("cuda", 2 << 30)
    assert offer.kind == "memfd" and "50% of the 3221225472 bytes free" in offer.reason


def test_the_pack_size_is_what_the_packer_takes(tmp_path: Path):
    groups = [[torch.ones(3, 5), torch.ones(7, dtype=torch.float64)], [torch.ones(1000)],
              [torch.ones(0), torch.ones(2, dtype=torch.bool)]]
    packer = Packer(tmp_path, "cpu")
    for group in groups:
        packer.add(group)
    assert device_pack.pack_bytes(groups) == packer.size == 256 + 256 + 4096 + 0 + 256


def test_a_worker_that_could_not_map_its_pack_uses_the_memory_file(tmp_path, monkeypatch,
                                                                      memfd):
    _lend(monkeypatch, None, "cannot map the device pack: cuMemMap failed")
    packer = Packer(None, "cpu", "cuda-fd")
    assert packer.kind == "memfd" and "cuMemMap" in packer.fallback
    descriptors = packer.add([torch.arange(6.0)])
    pack = packer.finish()
    assert pack == {"kind": "memfd", "size": 256}
    buffer = open_pack(pack, tmp_path, "cpu", "cuda-fd", memfd)
    assert torch.equal(unpack(buffer, descriptors)[0], torch.arange(6.0))


def test_outputs_outgrowing_the_device_pack_move_to_the_memory_file(tmp_path, monkeypatch,
                                                                    memfd):
    _lend(monkeypatch, FakeMemory(512))
    packer = Packer(None, "cpu", "cuda-fd")
    first = packer.add([torch.arange(10.0), torch.full((3,), 7, dtype=torch.int64)])
    assert packer.kind == "cuda-fd"
    second = packer.add([torch.arange(100.0)])  # 512 bytes taken: no room left
    assert packer.kind == "memfd" and "exceed the device pack's 512 bytes" in packer.fallback
    buffer = open_pack(packer.finish(), tmp_path, "cpu", "cuda-fd", memfd)
    got = unpack(buffer, first) + unpack(buffer, second)
    assert torch.equal(got[0], torch.arange(10.0)) and torch.equal(got[2], torch.arange(100.0))
    assert got[1].tolist() == [7, 7, 7]


def test_a_lent_pack_is_read_in_place_and_its_description_checked(tmp_path, monkeypatch,
                                                                  memfd):
    memory = FakeMemory(4096)
    _lend(monkeypatch, memory)
    packer = Packer(None, "cpu", "cuda-fd")
    descriptors = packer.add([torch.arange(12, dtype=torch.int32).reshape(3, 4)])
    pack = packer.finish()
    assert pack == {"kind": "cuda-fd", "size": 256}
    buffer = open_pack(pack, tmp_path, "cpu", "cuda-fd", memfd, memory)
    assert buffer.data_ptr() == memory.buffer.data_ptr()  # no copy
    assert unpack(buffer, descriptors)[0].sum() == 66
    with pytest.raises(TransportError, match="larger than the 4096 bytes lent"):
        open_pack({**pack, "size": 4097}, tmp_path, "cpu", "cuda-fd", memfd, memory)
    with pytest.raises(TransportError, match="lent none"):
        open_pack(pack, tmp_path, "cpu", "cuda-fd", memfd, None)
    with pytest.raises(TransportError, match="'file'; cuda-fd or memfd expected"):
        open_pack({**pack, "kind": "file"}, tmp_path, "cpu", "cuda-fd", memfd, memory)
    with pytest.raises(TransportError, match="'cuda-fd'; memfd expected"):
        open_pack(pack, tmp_path, "cpu", "memfd", memfd, memory)
    with pytest.raises(TransportError, match="do not fit"):
        unpack(buffer, [{**descriptors[0], "offset": 256}])


def test_a_kept_call_is_read_only_from_a_pack_the_worker_was_lent(memfd):
    """The judge reads a kept call at once, from the pack it lent or the memory file it
    created; descriptors past the lent memory, or a pack kind not lent, are refused."""
    from cuda_agent.judge.calls import ProtocolError
    from cuda_agent.judge.plan import kept_reader

    packer = Packer(None, "cpu", "memfd")
    outputs = packer.add([torch.arange(6.0)])
    inputs = packer.add([torch.ones(3, dtype=torch.int64)])
    worker = SimpleNamespace(pack_fd=memfd, device_pack=FakeMemory(256))
    read = kept_reader(worker, "cpu", 512)
    got_out, got_in = read({"pack": packer.flush(), "outputs": outputs, "inputs": inputs})
    assert torch.equal(got_out[0], torch.arange(6.0)) and got_in[0].tolist() == [1, 1, 1]
    with pytest.raises(ProtocolError, match="256 lent"):
        read({"pack": "cuda-fd", "outputs": outputs, "inputs": inputs})
    with pytest.raises(ProtocolError, match="at most 512 expected"):  # never read, not kept
        read({"pack": "memfd", "outputs": outputs,
              "inputs": [{**inputs[0], "offset": 1 << 28}]})
    with pytest.raises(ProtocolError, match="not one this worker was lent"):
        read({"pack": "file", "outputs": outputs, "inputs": []})
    with pytest.raises(ProtocolError, match="list of outputs"):
        read({"pack": "memfd", "outputs": {"offset": 0}, "inputs": []})


RECEIVE = """
import json, os, sys
from cuda_agent.judge import device_pack

class Attach:  # stands in for mapping device memory: writes through the descriptor
    @staticmethod
    def attach(fd, nbytes, ordinal):
        os.pwrite(fd, b"written by pid %d" % os.getpid(), 0)
        return {"nbytes": nbytes, "ordinal": ordinal}

device_pack.DeviceMemory = Attach
device_pack.receive({"pack_bytes": 4096, "pack_device": 0})
print(json.dumps([*device_pack.imported(), os.readlink("/proc/self/ns/pid")]))
"""


def test_the_descriptor_reaches_a_confined_worker_with_its_job(tmp_path: Path):
    from cuda_agent.execution.sandbox_local import confine_argv, namespace_prefix
    from cuda_agent.judge.confine import confinement

    judge_end, worker_end = device_pack.channel()
    target = shared_pack.create(4096)  # any descriptor: here a memory file stands in
    lent = SimpleNamespace(fd=os.dup(target), close_fd=lambda: os.close(lent.fd))
    prefix, confine = namespace_prefix(network=False), confinement("auto")
    argv = [sys.executable, "-c", RECEIVE]
    if prefix is not None and confine is not None:
        argv = confine_argv(prefix, tmp_path, list(confine.keep), init=True) + argv
    try:
        device_pack.send(judge_end, lent)
        done = subprocess.run(argv, pass_fds=(worker_end.fileno(),), capture_output=True,
                              text=True, timeout=120, cwd=tmp_path,
                              env={**os.environ, device_pack.ENV_SOCK: str(worker_end.fileno())})
        assert done.returncode == 0, done.stderr[-2000:]
        memory, _, namespace = json.loads(done.stdout.splitlines()[-1])
        assert memory == {"nbytes": 4096, "ordinal": 0}
        assert os.pread(target, 64, 0).startswith(b"written by pid ")
        if prefix is not None and confine is not None:  # it crossed into another pid namespace
            assert namespace != os.readlink("/proc/self/ns/pid")
    finally:
        judge_end.close()
        worker_end.close()
        os.close(target)


class LentStandIn(FakeMemory):
    """A lent pack whose descriptor is a memory file: it reaches the worker, which cannot
    map it as device memory and so falls back, as it would on a failed import."""

    def __init__(self):
        super().__init__(1 << 21)
        self.fd: int | None = shared_pack.create(4096)

    def close_fd(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


@pytest.mark.skipif(not namespaces_work(), reason="confine='on' needs namespaces")
def test_the_judge_lends_sends_and_reads_each_kept_call_end_to_end(tmp_path, scale_add_task,
                                                                   monkeypatch):
    from cuda_agent.judge import Candidate, Judge, JudgeConfig
    from cuda_agent.tasks import load_task
    from cuda_agent.workspace import init_workspace
    from tests.conftest import write_solution

    lent: list[LentStandIn] = []
    seen: list[int] = []
    real = shared_pack.read

    def lend(device: str, nbytes: int | None) -> device_pack.PackOffer:
        assert nbytes == 3 * aligned(100_003 * 4)  # one call's output and its two inputs
        lent.append(LentStandIn())
        return device_pack.PackOffer("cuda-fd", None, lent[-1])

    def spy(fd: int, size: int, device: str, offset: int = 0):
        seen.append(size)
        return real(fd, size, device, offset)

    monkeypatch.setattr(device_pack, "offer", lend)
    monkeypatch.setattr(shared_pack, "read", spy)
    root = init_workspace(load_task(scale_add_task), tmp_path / "ws", "cpu")
    write_solution(root)
    config = JudgeConfig(device="cpu", time=False, trials=1, confine="on")
    with Judge(config) as judge:
        result = judge.judge(load_task(scale_add_task), Candidate.from_ref(root))
    assert result.correct and result.isolation == "namespaces", result.reasons
    # the worker could not map the stand-in, so each kept call came through its memory
    # file, read at once: one call at scale 1, one scaled (and a stand-in's)
    assert len(seen) >= 2 and lent[0].fd is None  # sent, then closed
