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
    with pytest.raises(TransportError, match="kind 'cuda-ipc' on device cpu"):
        open_pack({**pack, "kind": "cuda-ipc"}, tmp_path, "cpu")
    with pytest.raises(TransportError, match="no output pack"):
        open_pack(None, tmp_path, "cpu")
    with pytest.raises(TransportError, match="not a list"):
        unpack(torch.zeros(8, dtype=torch.uint8), {"offset": 0})


@pytest.mark.gpu
def test_cuda_pack_crosses_processes_and_a_lying_pack_is_refused(tmp_path: Path):
    """A real worker exports by CUDA IPC; a pack claiming more bytes than its allocation is
    refused before it is read, and this process's CUDA context stays usable."""
    import subprocess
    import sys

    script = tmp_path / "export.py"
    script.write_text(
        "import json, sys, torch\n"
        "from pathlib import Path\n"
        "from cuda_agent.judge.transport import Packer\n"
        "p = Packer(Path(sys.argv[1]), 'cuda')\n"
        "d = p.add([torch.arange(1000, device='cuda', dtype=torch.float32).reshape(10, 100)])\n"
        "print(json.dumps({'pack': p.finish(), 'd': d}), flush=True)\n"
        "sys.stdin.read()\n")
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        import json

        record = json.loads(proc.stdout.readline())
        got = unpack(open_pack(record["pack"], tmp_path, "cuda"), record["d"])[0]
        assert torch.equal(got.cpu(), torch.arange(1000.0).reshape(10, 100))
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
