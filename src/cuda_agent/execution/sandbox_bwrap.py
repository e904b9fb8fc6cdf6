"""bubblewrap backend: ``bwrap`` namespaces, a read-only / and a writable workspace.

Install with ``apt install bubblewrap``. The argv (see ``bwrap_argv``) binds / read-only,
the workspace read-write, fresh /tmp, /dev (plus /dev/nvidia* for the GPU) and /proc,
unshares every namespace (``--share-net`` only when ``network`` is true), drops all
capabilities and dies with its parent. Rlimits and the pids cgroup come from
``run_process`` as for the local backend. Reads of the rest of / are NOT hidden.
"""

from __future__ import annotations

import functools
import glob
import shutil
import subprocess
from pathlib import Path

from cuda_agent.execution.sandbox import (
    CommandResult,
    SandboxConfig,
    as_argv,
    hidden_needs,
    run_process,
)


class BwrapSandbox:
    """Runs commands under bubblewrap."""

    def run(self, command: str | list[str], workdir: Path, config: SandboxConfig) -> CommandResult:
        workdir = Path(workdir).resolve()
        argv = bwrap_argv(as_argv(command), workdir, config.network, keep=hidden_needs(config))
        isolation = ("mount", "pid", "caps") + (() if config.network else ("net",))
        return run_process(argv, workdir, config, isolation)


def bwrap_argv(
    argv: list[str],
    workdir: Path,
    network: bool,
    gpu_devices: list[str] | None = None,
    keep: list[str] | None = None,
) -> list[str]:
    """The bwrap command line that runs ``argv`` confined to ``workdir``."""
    devices = sorted(glob.glob("/dev/nvidia*")) if gpu_devices is None else gpu_devices
    ws = str(workdir)
    cmd = [
        "bwrap",
        "--ro-bind",
        "/",
        "/",
        "--dev",
        "/dev",
        "--proc",
        "/proc",
        "--ro-bind",
        "/proc/sys",
        "/proc/sys",
        "--tmpfs",
        "/tmp",
        "--bind",
        ws,
        ws,
        "--unshare-all",
        "--die-with-parent",
        "--cap-drop",
        "ALL",
        "--chdir",
        ws,
    ]
    for path in keep or []:  # under /tmp: hidden by the tmpfs, shown again read-only
        cmd += ["--ro-bind", path, path]
    for dev in devices:
        cmd += ["--dev-bind", dev, dev]
    if network:
        cmd.append("--share-net")
    return [*cmd, "--", *argv]


@functools.cache
def bwrap_problem() -> str | None:
    """Why bwrap cannot run here, or None if it can (checked once per process)."""
    if shutil.which("bwrap") is None:
        return "bubblewrap not installed: apt install bubblewrap"
    probe = bwrap_argv(["true"], Path("/"), network=False, gpu_devices=[])
    try:
        done = subprocess.run(probe, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"bwrap does not run here: {err}"
    if done.returncode != 0:
        return f"bwrap cannot create namespaces here: {done.stderr.strip()[:300]}"
    return None
