"""A sealed memory file for a confined worker's output pack.

CUDA IPC handles do not work across pid namespaces, and writing gigabytes of outputs to a
file on disk and reading them back costs seconds. Instead the judge creates an anonymous
memory file (``memfd``) before it starts the worker, fixes its size and seals it against
shrinking and growing, and passes the descriptor down. The worker writes each output
tensor at its offset; the judge maps the range it was told about read-only and copies it
to the device (or to its own memory). The seals mean a hostile process cannot truncate the
file under the judge's mapping (which would kill the judge with SIGBUS); the size is a
sparse upper bound, so only what is written takes memory.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import warnings

import torch

ENV_FD = "CUDA_AGENT_PACK_FD"
"""The environment variable through which a worker learns its pack's descriptor."""

_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


def create(max_bytes: int) -> int:
    """A new sealed memory file of ``max_bytes`` (sparse); returns its descriptor, which is
    inheritable so that it can be passed to a worker."""
    fd = os.memfd_create("cuda-agent-pack", os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, max_bytes)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
        os.set_inheritable(fd, True)
    except OSError:
        os.close(fd)
        raise
    return fd


def capacity(fd: int) -> int:
    return os.fstat(fd).st_size


def write(fd: int, offset: int, data: torch.Tensor) -> None:
    """Write the bytes of a flat uint8 tensor (on any device) at ``offset`` of the file
    ``fd`` (this module's memory file, or any regular file)."""
    host = data.cpu() if data.device.type != "cpu" else data
    view = memoryview(host.numpy())
    done = 0
    while done < len(view):
        done += os.pwrite(fd, view[done:], offset + done)


def read(fd: int, size: int, device: str, offset: int = 0) -> torch.Tensor:
    """``size`` bytes from ``offset``, copied into memory this process owns on
    ``device``."""
    if size == 0:
        return torch.empty(0, dtype=torch.uint8, device=device)
    if (fcntl.fcntl(fd, fcntl.F_GET_SEALS) & _SEALS) != _SEALS or \
            offset + size > capacity(fd):
        raise ValueError("the output pack's memory file is not sealed or is too small")
    start = offset - offset % mmap.ALLOCATIONGRANULARITY  # mappings start on a page
    with mmap.mmap(fd, offset - start + size, prot=mmap.PROT_READ, offset=start) as mapped, \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a read-only buffer: the view is never written
        view = torch.frombuffer(mapped, dtype=torch.uint8)[offset - start:]
        own = view.to(device) if device.startswith("cuda") else view.clone()
        del view
    return own
