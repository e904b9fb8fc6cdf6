"""Judges that share a GPU take turns on it: a file lock around every phase that uses it.

A pool may run several judges per GPU (``PoolConfig.jobs_per_gpu``) so that one job's CPU
work (worker start-up, the build, static checks) overlaps another's GPU work. Timing still
needs the whole GPU, so each judge holds the GPU's lock from its reference run to its last
comparison; ``flock`` on a file (one per GPU, under the cuda-agent home) works across
processes and is released by the kernel if the holder dies.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


class GpuTurn:
    """The lock at ``path`` (created if missing); ``None``: no lock, turns are free."""

    def __init__(self, path: str | Path | None):
        self.path = Path(path) if path else None
        self._fd: int | None = None

    def acquire(self) -> None:
        """Wait for the GPU's turn (no-op without a lock)."""
        if self.path is None:
            return
        if self._fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX)

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
