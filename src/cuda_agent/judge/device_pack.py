"""The ``cuda-fd`` output pack: device memory the judge lends a confined worker.

CUDA IPC handles do not cross pid namespaces, so a confined candidate's outputs otherwise
travel through a sealed memory file (``shared_pack``): copied to the host in the worker and
back to the device in the judge, about 2 s for 2.4 GB. Instead the judge allocates the
pack in device memory, sized for the outputs it expects (the reference's, at the aligned
offsets ``transport`` packs them at), exports it as a file descriptor (``cuda_vmm``) and
hands the descriptor over with the job, through a Unix socket the worker inherited (a
worker starts before the sizes are known, so the descriptor cannot be inherited at start).
The worker maps it before any candidate code runs and copies each output in on the device;
the judge reads the memory in place, and only once the worker and its whole pid namespace
have exited, so nothing of the candidate's can change it during the comparison.

Fallbacks, both to the sealed memory file every confined worker has as well:

- the judge names ``memfd`` (``offer``, with the reason) off CUDA, without reference
  outputs to size the pack by (``check`` off), when the pack would take over half the free
  device memory, when ``CUDA_AGENT_CUDA_FD=0``, or when the driver refuses (no libcuda, no
  virtual memory management or descriptor export, ``cuMemCreate`` fails);
- the worker reports ``memfd`` when it cannot map what it was sent, or when its outputs
  outgrow the pack (it then moves what it packed so far to the memory file, at the same
  offsets). The judge accepts either kind where it named ``cuda-fd``.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from cuda_agent.judge import cuda_driver
from cuda_agent.judge.cuda_vmm import DeviceMemory
from cuda_agent.judge.transport import TransportError, pack_size

ENV_SOCK = "CUDA_AGENT_PACK_SOCK"
"""The environment variable through which a confined worker learns its socket's number."""
ENV_SWITCH = "CUDA_AGENT_CUDA_FD"
"""Set to ``0`` to turn device packs off (confined workers then always use ``memfd``)."""
SHARE_OF_FREE = 0.5
"""A device pack may take at most this share of the device's free memory."""
RECEIVE_TIMEOUT_S = 10.0
_IMPORTED: dict[str, Any] = {}  # the worker's mapping of its pack, or why there is none


@dataclass(frozen=True)
class PackOffer:
    """The pack kind the judge names for a confined worker: ``cuda-fd`` with its memory,
    or ``memfd`` and why not a device pack."""

    kind: str
    reason: str | None = None
    memory: DeviceMemory | None = None


def pack_bytes(groups: Iterable[list[torch.Tensor]]) -> int:
    """Bytes of a pack holding these groups of tensors, each at an aligned offset."""
    return pack_size(t.numel() * t.element_size() for group in groups for t in group)


def offer(device: str, nbytes: int | None) -> PackOffer:
    """A device pack of at least ``nbytes`` on ``device`` where one can be had (None: the
    size is unknown), else ``memfd`` with the reason."""
    if not device.startswith("cuda"):
        return PackOffer("memfd", f"device {device} is not a CUDA device")
    if os.environ.get(ENV_SWITCH, "1").strip() == "0":
        return PackOffer("memfd", f"device packs turned off ({ENV_SWITCH}=0)")
    if nbytes is None:
        return PackOffer("memfd", "no reference outputs to size a device pack by")
    try:
        cuda_driver.driver()
        ordinal = torch.device(device).index
        ordinal = torch.cuda.current_device() if ordinal is None else ordinal
        free = cuda_driver.free_bytes(ordinal)
        if nbytes > SHARE_OF_FREE * free:
            return PackOffer("memfd", f"a device pack of {nbytes} bytes would take over "
                             f"{SHARE_OF_FREE:.0%} of the {free} bytes free on device "
                             f"{ordinal}")
        memory = DeviceMemory.create(nbytes, ordinal)
    except TransportError as exc:
        return PackOffer("memfd", f"device pack unavailable: {exc}")
    try:
        # no stale bytes of this process's earlier allocations reach the worker, nor come
        # back as outputs it never wrote; finished before the worker may write
        memory.tensor().zero_()
        torch.cuda.synchronize(ordinal)
    except (RuntimeError, TypeError) as exc:
        memory.free()
        return PackOffer("memfd", f"device pack unusable here: {str(exc)[:300]}")
    return PackOffer("cuda-fd", None, memory)


def channel() -> tuple[socket.socket, socket.socket]:
    """A connected pair of Unix sockets: the judge's end and the end a worker inherits
    (its number in ``ENV_SOCK``)."""
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)


def send(sock: socket.socket, memory: DeviceMemory) -> None:
    """Pass the pack's descriptor to the worker at the other end of ``sock``; the judge's
    own copy is closed (the memory stays mapped here)."""
    if memory.fd is None:
        raise TransportError("the device pack's descriptor was already passed on")
    try:
        sock.settimeout(RECEIVE_TIMEOUT_S)
        socket.send_fds(sock, [b"P"], [memory.fd])
    finally:
        memory.close_fd()


def receive(job: dict[str, Any]) -> None:
    """Worker side, before any candidate code runs: map the device pack the judge sent with
    ``job``. Whatever goes wrong is kept for ``imported`` (the pack then falls back)."""
    _IMPORTED.clear()
    try:
        _IMPORTED["memory"] = _attach(job)
    except Exception as exc:  # any failure here only means the memory file is used
        _IMPORTED["error"] = f"cannot map the device pack: {type(exc).__name__}: {exc}"


def received() -> bool:
    """Whether ``receive`` ran in this worker (mapped or not)."""
    return bool(_IMPORTED)


def imported() -> tuple[DeviceMemory | None, str]:
    """This worker's mapping of its device pack, or None and why there is none."""
    return _IMPORTED.get("memory"), _IMPORTED.get("error", "no device pack was received")


def _attach(job: dict[str, Any]) -> DeviceMemory:
    nbytes, ordinal = job.get("pack_bytes"), job.get("pack_device")
    if type(nbytes) is not int or type(ordinal) is not int or nbytes <= 0 or ordinal < 0:
        raise ValueError("the job names no valid device pack size and device")
    with socket.socket(fileno=int(os.environ[ENV_SOCK])) as sock:
        sock.settimeout(RECEIVE_TIMEOUT_S)
        _, fds, flags, _ = socket.recv_fds(sock, 16, 1)
    try:
        if len(fds) != 1 or flags & socket.MSG_CTRUNC:
            raise TransportError("no descriptor came with the job")
        return DeviceMemory.attach(fds[0], nbytes, ordinal)
    finally:
        for fd in fds:
            os.close(fd)
