"""Move a worker's output tensors to the judge: one packed buffer, described in JSON.

A worker copies every tensor it reports into one flat byte buffer (each tensor contiguous,
aligned to ``ALIGN`` bytes) and describes each by offset, byte count, dtype and shape. On
CUDA the buffer stays in device memory: its CUDA IPC handle travels in the JSON, the judge
maps it, checks that the range it was told about lies inside the mapped allocation, copies
the bytes into its own memory and only then lets the worker exit. CUDA IPC does not cross
pid namespaces: a confined worker writes into device memory the judge lent it
(``cuda-fd``, ``device_pack``), which the judge reads only once the worker has exited, or
else into a sealed memory file the judge created (``memfd``, ``shared_pack``); otherwise on
CPU the buffer is a file in the worker's folder. The judge names the kind it expects; any
other is refused (where it named ``cuda-fd`` it also takes ``memfd``, the fallback). Nothing
is unpickled; every field is checked before use, so a hostile candidate's process can make
its own outputs unreadable, never the judge unhealthy.
"""

from __future__ import annotations

import base64
import ctypes
import math
import os
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from cuda_agent.judge import shared_pack

ALIGN = 256
KINDS = ("file", "cuda-ipc", "memfd", "cuda-fd")
DEVICE_HOLD = 1 << 30
"""Bytes of a CUDA pack kept on the device until ``finish``; later outputs wait on the host."""
DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64,
    torch.complex128, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8,
    torch.bool)}
_HELD: list[torch.Tensor] = []  # exported device buffers stay alive until the process exits
_REF_NAME = re.compile(rb"^/torch_[0-9A-Za-z_]{1,80}$")


class TransportError(RuntimeError):
    """A pack could not be written or read: what and why."""


class Packer:
    """Collect tensors in the order reported; ``finish`` writes the pack and describes it."""

    def __init__(self, folder: Path, device: str, kind: str | None = None):
        self.kind = kind or pack_kind(device, confined=False)
        if self.kind not in KINDS:
            raise TransportError(f"unknown pack kind {self.kind!r}")
        self.folder, self.cuda = folder, self.kind == "cuda-ipc"
        self.parts: list[tuple[int, torch.Tensor]] = []
        self._buffer: torch.Tensor | None = None  # a reserved CUDA IPC pack (``reserve``)
        self.size = 0
        self.fallback: str | None = None
        self._fd = _memfd() if self.kind in ("memfd", "cuda-fd") else None
        if self.kind == "memfd" and self._fd is None:
            raise TransportError("a memory-file pack, but this worker was given none")
        self._device: torch.Tensor | None = None  # the lent device pack (cuda-fd)
        if self.kind == "cuda-fd":
            from cuda_agent.judge import device_pack

            memory, why = device_pack.imported()
            if memory is None:
                self._fall_back(why)
            else:
                self._device = memory.tensor()
        self._file = (folder / "outputs.bin").open("wb") if self.kind == "file" else None

    def add(self, values: list[Any]) -> list[dict[str, Any]]:
        """Copy each plain tensor of ``values`` now (later writes to it do not count)."""
        descriptors = []
        for k, value in enumerate(values):
            if type(value) is not torch.Tensor:
                raise TransportError(f"output {k} is a {type(value).__name__}, not a plain "
                                     "torch.Tensor")
            data = value.detach().contiguous().reshape(-1).view(torch.uint8)
            offset = self.size
            if self._device is not None and offset + data.numel() > self._device.numel():
                self._fall_back(f"the outputs exceed the device pack's "
                                f"{self._device.numel()} bytes")
            if self._buffer is not None and offset + data.numel() <= self._buffer.numel():
                self._buffer[offset:offset + data.numel()].copy_(data)
            elif self.cuda:
                # past DEVICE_HOLD bytes the copies wait in host memory: finishing the pack
                # then needs the pack's size on the device once, not twice
                on_device = offset + data.numel() <= DEVICE_HOLD
                self.parts.append((offset, data.clone() if on_device else data.cpu()))
            elif self._device is not None:
                self._device[offset:offset + data.numel()].copy_(data)
            elif self._fd is not None:
                self._write_memfd(offset, data)
            else:
                shared_pack.write(self._file.fileno(), offset, data)
            self.size = offset + aligned(data.numel())
            descriptors.append({"offset": offset, "nbytes": data.numel(),
                                "dtype": str(value.dtype).removeprefix("torch."),
                                "shape": list(value.shape)})
        return descriptors

    def reset(self) -> None:
        """Pack from offset 0 again (a kept call is read by the judge before the next)."""
        self.size = 0
        self.parts.clear()

    def flush(self) -> str:
        """Make what was added readable by the judge now (the copies into a device pack
        finished); the pack's kind, which a fallback may have changed."""
        if self._device is not None and self._device.is_cuda:
            torch.cuda.synchronize(self._device.device)
        elif self._file is not None:
            self._file.flush()
        return self.kind

    def reserve(self, nbytes: int) -> bool:
        """A CUDA IPC pack that will hold ``nbytes`` (the packer's caller has planned its
        outputs): allocate it now, so each output is copied straight in, never through host
        memory, when it fits in half the device's free memory. Returns whether it did."""
        if not self.cuda or self.size or self._buffer is not None or nbytes <= 0:
            return False
        free, _ = torch.cuda.mem_get_info()
        if nbytes > free // 2:
            return False
        self._buffer = torch.zeros(nbytes, dtype=torch.uint8, device="cuda")
        return True

    def finish(self) -> dict[str, Any]:
        if self._device is not None:
            if self._device.is_cuda:  # the copies in are done before the judge is told
                torch.cuda.synchronize(self._device.device)
            return {"kind": "cuda-fd", "size": self.size}
        if self._fd is not None:
            return {"kind": "memfd", "size": self.size}
        if not self.cuda:
            self._file.truncate(self.size)
            self._file.close()
            return {"kind": "file", "name": "outputs.bin", "size": self.size}
        buffer = self._buffer
        if buffer is None or self.parts:
            buffer = torch.zeros(max(self.size, 1), dtype=torch.uint8, device="cuda")
            if self._buffer is not None:  # outgrew its reservation: what it holds moves over
                buffer[:self._buffer.numel()].copy_(self._buffer)
                self._buffer = None
        while self.parts:
            offset, data = self.parts.pop(0)
            buffer[offset:offset + data.numel()].copy_(data)
            del data
        torch.cuda.synchronize()
        _HELD.append(buffer)
        (device, handle, storage_bytes, storage_offset, ref_handle, ref_offset, event_handle,
         event_sync) = buffer.untyped_storage()._share_cuda_()
        return {"kind": "cuda-ipc", "size": self.size, "device": device,
                "handle": _b64(handle), "storage_bytes": storage_bytes,
                "storage_offset": storage_offset, "ref_handle": _b64(ref_handle),
                "ref_offset": ref_offset, "event_handle": _b64(event_handle),
                "event_sync": bool(event_sync)}

    def _write_memfd(self, offset: int, data: torch.Tensor) -> None:
        if offset + data.numel() > shared_pack.capacity(self._fd):
            raise TransportError("the outputs exceed the output pack's "
                                 f"{shared_pack.capacity(self._fd)} bytes")
        shared_pack.write(self._fd, offset, data)

    def _fall_back(self, why: str) -> None:
        """From the device pack to the memory file: what was packed so far moves over, at
        the same offsets, and the pack is finished as ``memfd``."""
        if self._fd is None:
            raise TransportError(f"{why}, and there is no memory file to fall back to")
        print(f"output pack: {why}; using the memory file instead", file=sys.stderr)
        packed, self._device = self._device, None
        if packed is not None and self.size:
            self._write_memfd(0, packed[:self.size])
        self.kind, self.fallback = "memfd", why


def pack_kind(device: str, confined: bool) -> str:
    """How a worker on ``device`` hands over its outputs: a sealed memory file from a worker
    in its own pid namespace (which the judge may upgrade to a lent device pack,
    ``device_pack.offer``), else device memory by CUDA IPC, or a file on CPU."""
    if confined:
        return "memfd"
    return "cuda-ipc" if device.startswith("cuda") else "file"


def open_pack(pack: Any, folder: Path, device: str, kind: str | None = None,
              pack_fd: int | None = None, memory: Any = None) -> torch.Tensor:
    """The pack's bytes, in memory this process owns (on ``device``); ``kind`` is the kind
    the worker was told to use (default: ``pack_kind(device, False)``), ``pack_fd`` the
    judge's descriptor of a ``memfd`` pack, ``memory`` the ``DeviceMemory`` of a
    ``cuda-fd`` pack, which is returned in place (read it only after the worker exited)."""
    if not isinstance(pack, dict):
        raise TransportError("no output pack described")
    size = _int(pack.get("size"), "size")
    expected = kind or pack_kind(device, confined=False)
    allowed = (expected, "memfd") if expected == "cuda-fd" else (expected,)
    if pack.get("kind") not in allowed:
        raise TransportError(f"output pack of kind {pack.get('kind')!r}; "
                             f"{' or '.join(allowed)} expected")
    if expected == "cuda-ipc":
        if not device.startswith("cuda"):
            raise TransportError(f"a CUDA IPC pack on device {device}")
        return _open_ipc(pack, size)
    if pack["kind"] == "cuda-fd":
        if memory is None:
            raise TransportError("a device pack, but the worker was lent none")
        if size > memory.size:
            raise TransportError(f"output pack of {size} bytes is larger than the "
                                 f"{memory.size} bytes lent")
        return memory.tensor()[:size]
    if pack["kind"] == "memfd":
        if pack_fd is None:
            raise TransportError("a memory-file pack, but the worker was given none")
        try:
            return shared_pack.read(pack_fd, size, device)
        except ValueError as exc:
            raise TransportError(str(exc)) from None
    path = folder / "outputs.bin"
    if path.is_symlink() or not path.is_file() or path.stat().st_size != size:
        raise TransportError(f"output pack is missing or not {size} bytes")
    buffer = torch.from_file(str(path), shared=False, size=size, dtype=torch.uint8)
    return buffer.to(device) if device.startswith("cuda") else buffer


def unpack(buffer: torch.Tensor, descriptors: Any) -> list[torch.Tensor]:
    """Tensors (views of ``buffer``) for a list of descriptors, each checked first."""
    if not isinstance(descriptors, list):
        raise TransportError("output descriptors are not a list")
    out = []
    for k, d in enumerate(descriptors):
        if not isinstance(d, dict) or d.get("dtype") not in DTYPES:
            raise TransportError(f"output {k}: bad descriptor or dtype")
        dtype = DTYPES[d["dtype"]]
        shape = d.get("shape")
        if not isinstance(shape, list) or not all(type(s) is int and s >= 0 for s in shape):
            raise TransportError(f"output {k}: bad shape {shape!r}")
        offset, nbytes = _int(d.get("offset"), "offset"), _int(d.get("nbytes"), "nbytes")
        itemsize = torch.empty((), dtype=dtype).element_size()
        if nbytes != math.prod(shape) * itemsize or offset % ALIGN or \
                offset + nbytes > buffer.numel():
            raise TransportError(f"output {k}: {nbytes} bytes at {offset} do not fit its "
                                 f"shape {shape} or the pack")
        out.append(buffer[offset:offset + nbytes].view(dtype).reshape(shape))
    return out


def _open_ipc(pack: dict[str, Any], size: int) -> torch.Tensor:
    device = _int(pack.get("device"), "device")
    if device >= torch.cuda.device_count():
        raise TransportError(f"output pack on unknown device {device}")
    ref_handle = _unb64(pack.get("ref_handle"))
    if not _REF_NAME.match(ref_handle):
        raise TransportError("output pack names an unexpected shared-memory counter")
    storage_bytes = _int(pack.get("storage_bytes"), "storage_bytes")
    if size > storage_bytes:
        raise TransportError("output pack larger than its storage")
    # mapping a handle before this process has a CUDA context on the device segfaults
    torch.cuda.init()
    torch.empty(1, device=f"cuda:{device}")
    try:
        storage = torch.UntypedStorage._new_shared_cuda(
            device, _unb64(pack.get("handle")), storage_bytes,
            _int(pack.get("storage_offset"), "storage_offset"), ref_handle,
            _int(pack.get("ref_offset"), "ref_offset"),
            None if pack.get("event_handle") is None else _unb64(pack.get("event_handle")),
            bool(pack.get("event_sync")))
    except RuntimeError as exc:
        raise TransportError(f"cannot map the output pack: {str(exc)[:300]}") from None
    mapped = torch.empty(0, dtype=torch.uint8, device=f"cuda:{device}").set_(storage)
    _check_range(mapped.data_ptr(), storage_bytes)
    own = mapped[:size].clone()
    torch.cuda.synchronize()
    return own


def _check_range(pointer: int, nbytes: int) -> None:
    """Refuse a storage that claims more bytes than the mapped allocation holds (reading
    past it would fault and poison this process's CUDA context)."""
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        raise TransportError(f"cannot check the output pack's range: {exc}") from None
    base, length = ctypes.c_uint64(), ctypes.c_size_t()
    status = libcuda.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(length),
                                             ctypes.c_uint64(pointer))
    if status != 0 or pointer + nbytes > base.value + length.value:
        raise TransportError("output pack extends past its allocation")


def aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def pack_size(nbytes: Iterable[int]) -> int:
    """Bytes of a pack holding items of these sizes, each at an aligned offset."""
    return sum(aligned(n) for n in nbytes)


def _memfd() -> int | None:
    text = os.environ.get(shared_pack.ENV_FD, "")
    return int(text) if text.isdigit() else None


def _int(value: Any, name: str) -> int:
    if type(value) is not int or value < 0:
        raise TransportError(f"output pack field {name!r} is not a non-negative integer")
    return value


def _b64(raw: bytes | None) -> str | None:
    return None if raw is None else base64.b64encode(raw).decode()


def _unb64(text: Any) -> bytes:
    if text is None:
        return b""
    if not isinstance(text, str) or len(text) > 4096:
        raise TransportError("output pack handle is not base64 text")
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:
        raise TransportError("output pack handle is not base64 text") from None
