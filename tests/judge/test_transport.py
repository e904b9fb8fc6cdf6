"""Output packs: what a worker reports reaches the judge intact, and a hostile description
of a pack is refused with a reason instead of being trusted."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
import torch

from cuda_agent.judge.transport import Packer, TransportError, open_pack, unpack


def _pack(tmp_path: Path, values: list) -> tuple[dict, list]:
    packer = Packer(tmp_path, "cpu")
    descriptors = packer.add(values)
    return packer.finish(), descriptors


def test_round_trip_keeps_values_dtypes_and_shapes(tmp_path: Path):
    values = [torch.randn(3, 5).t(),  # not contiguous
              torch.randn(7, dtype=torch.float64), torch.randn(2, 2).to(torch.bfloat16),
              torch.tensor(True), torch.arange(10, dtype=torch.int64)[::3],
              torch.empty(0, 4), torch.randn(2, dtype=torch.complex64)]
    pack, descriptors = _pack(tmp_path, values)
    got = unpack(open_pack(pack, tmp_path, "cpu"), descriptors)
    for a, b in zip(values, got, strict=True):
        assert (a.dtype, a.shape) == (b.dtype, b.shape)
        assert torch.equal(a, b)


def test_values_are_copied_when_reported(tmp_path: Path):
    out = torch.zeros(4)
    packer = Packer(tmp_path, "cpu")
    first = packer.add([out])
    out.fill_(7.0)  # a module that reuses its output buffer between calls
    second = packer.add([out])
    buffer = open_pack(packer.finish(), tmp_path, "cpu")
    assert unpack(buffer, first)[0].eq(0).all() and unpack(buffer, second)[0].eq(7).all()


@pytest.mark.parametrize("value", [torch.nn.Parameter(torch.ones(2)), 3.0, [torch.ones(1)]])
def test_only_plain_tensors_are_packed(tmp_path: Path, value):
    with pytest.raises(TransportError, match="not a plain torch.Tensor"):
        Packer(tmp_path, "cpu").add([value])


@pytest.mark.parametrize("change, message", [
    ({"dtype": "object"}, "dtype"),
    ({"shape": [4, -1]}, "bad shape"),
    ({"shape": [5]}, "do not fit"),
    ({"offset": 256}, "do not fit"),
    ({"offset": 4}, "do not fit"),
    ({"nbytes": True}, "non-negative integer"),
])
def test_hostile_descriptors_are_refused(tmp_path: Path, change: dict, message: str):
    pack, descriptors = _pack(tmp_path, [torch.ones(4)])
    buffer = open_pack(pack, tmp_path, "cpu")
    with pytest.raises(TransportError, match=message):
        unpack(buffer, [{**descriptors[0], **change}])


def test_hostile_packs_are_refused(tmp_path: Path):
    pack, _ = _pack(tmp_path, [torch.ones(4)])
    with pytest.raises(TransportError, match="not 300 bytes"):
        open_pack({**pack, "size": 300}, tmp_path, "cpu")
    with pytest.raises(TransportError, match="kind 'cuda-ipc'; file expected"):
        open_pack({**pack, "kind": "cuda-ipc"}, tmp_path, "cpu")
    with pytest.raises(TransportError, match="CUDA IPC pack on device cpu"):
        open_pack({**pack, "kind": "cuda-ipc"}, tmp_path, "cpu", "cuda-ipc")
    with pytest.raises(TransportError, match="no output pack"):
        open_pack(None, tmp_path, "cpu")
    with pytest.raises(TransportError, match="not a list"):
        unpack(torch.zeros(8, dtype=torch.uint8), {"offset": 0})


@pytest.mark.gpu
@pytest.mark.parametrize("reserve", [0, 2 * 4096 + 256, 4096])
def test_cuda_pack_crosses_processes_and_a_lying_pack_is_refused(tmp_path: Path, reserve: int):
    """A real worker exports by CUDA IPC (without a reservation, with one that fits, with one
    its outputs outgrow); a pack claiming more bytes than its allocation is refused before it
    is read, and this process's CUDA context stays usable."""
    import subprocess
    import sys

    script = tmp_path / "export.py"
    script.write_text(
        "import json, sys, torch\n"
        "from pathlib import Path\n"
        "from cuda_agent.judge.transport import Packer\n"
        "p = Packer(Path(sys.argv[1]), 'cuda')\n"
        "assert p.reserve(int(sys.argv[2])) is (int(sys.argv[2]) > 0)\n"
        "x = torch.arange(1000, device='cuda', dtype=torch.float32).reshape(10, 100)\n"
        "d = p.add([x]) + p.add([x * 2])\n"
        "print(json.dumps({'pack': p.finish(), 'd': d}), flush=True)\n"
        "sys.stdin.read()\n")
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path), str(reserve)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        import json

        record = json.loads(proc.stdout.readline())
        got = unpack(open_pack(record["pack"], tmp_path, "cuda"), record["d"])
        assert torch.equal(got[0].cpu(), torch.arange(1000.0).reshape(10, 100))
        assert torch.equal(got[1].cpu(), 2 * torch.arange(1000.0).reshape(10, 100))
        lying = {**record["pack"], "storage_bytes": 1 << 40, "size": 1 << 40}
        with pytest.raises(TransportError):
            open_pack(lying, tmp_path, "cuda")
        bad_name = {**record["pack"],
                    "ref_handle": base64.b64encode(b"/etc/passwd").decode()}
        with pytest.raises(TransportError, match="shared-memory counter"):
            open_pack(bad_name, tmp_path, "cuda")
        assert float(torch.ones(3, device="cuda").sum()) == 3.0
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)


# --- sealed memory-file packs (confined workers) -------------------------------------------

FILL_AND_TRUNCATE = """
import os, sys, torch
from cuda_agent.judge.transport import Packer
packer = Packer(None, "cpu", "memfd")
packer.add([torch.arange(6, dtype=torch.float32).reshape(2, 3), torch.ones(5, dtype=torch.int64)])
print(packer.finish()["size"])
try:
    os.ftruncate(int(os.environ["CUDA_AGENT_PACK_FD"]), 0)  # would fault the judge's mapping
    print("truncated")
except OSError:
    print("refused")
"""


def _memfd_worker(capacity: int) -> tuple[int, list[str]]:
    import os
    import subprocess
    import sys

    from cuda_agent.judge import shared_pack

    fd = shared_pack.create(capacity)
    done = subprocess.run([sys.executable, "-c", FILL_AND_TRUNCATE], pass_fds=(fd,),
                          env={**os.environ, shared_pack.ENV_FD: str(fd)},
                          capture_output=True, text=True, timeout=120)
    return fd, done.stdout.split() or [done.stderr[-500:]]


def test_memfd_pack_crosses_processes_and_cannot_be_truncated(tmp_path: Path):
    import os

    fd, said = _memfd_worker(1 << 20)
    try:
        assert said[1] == "refused", said
        size = int(said[0])
        descriptors = [{"offset": 0, "nbytes": 24, "dtype": "float32", "shape": [2, 3]},
                       {"offset": 256, "nbytes": 40, "dtype": "int64", "shape": [5]}]
        buffer = open_pack({"kind": "memfd", "size": size}, tmp_path, "cpu", "memfd", fd)
        got = unpack(buffer, descriptors)
        assert torch.equal(got[0], torch.arange(6, dtype=torch.float32).reshape(2, 3))
        assert torch.equal(got[1], torch.ones(5, dtype=torch.int64))
        with pytest.raises(TransportError, match="too small"):
            open_pack({"kind": "memfd", "size": (1 << 20) + 1}, tmp_path, "cpu", "memfd", fd)
        with pytest.raises(TransportError, match="expected"):
            open_pack({"kind": "file", "size": size}, tmp_path, "cpu", "memfd", fd)
    finally:
        os.close(fd)


def test_outputs_larger_than_the_memfd_pack_fail_in_the_worker():
    import os

    fd, said = _memfd_worker(128)
    os.close(fd)
    assert "exceed the output pack" in " ".join(said), said


def test_only_a_cuda_pack_takes_a_reservation(tmp_path: Path):
    assert Packer(tmp_path, "cpu").reserve(4096) is False
