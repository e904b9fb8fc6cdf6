"""Docker backend: one ``docker run --rm`` container per command.

The container (see ``docker_argv``) has no network unless ``network`` is true, a read-only
root file system, a tmpfs /tmp, only the workspace mounted (read-write, same path), a pids
limit, a memory limit (a cgroup, so it counts real memory rather than address space),
``ulimit`` cpu and fsize, no capabilities and no-new-privileges. It sees only the image's
files. It lacks the GPU unless the image and ``--gpus`` are added. On timeout the container
is removed with ``docker rm -f``.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
import uuid
from pathlib import Path

from cuda_agent.execution.sandbox import (
    CommandResult,
    SandboxConfig,
    as_argv,
    run_process,
    scrubbed_env,
)


class DockerSandbox:
    """Runs commands in a throwaway container."""

    def run(self, command: str | list[str], workdir: Path,
            config: SandboxConfig) -> CommandResult:
        workdir = Path(workdir).resolve()
        name = f"cuda-agent-{uuid.uuid4().hex[:12]}"
        argv = docker_argv(as_argv(command), workdir, config, name)
        isolation = ("mount", "pid", "caps", "container") + (() if config.network else ("net",))
        try:
            return run_process(argv, workdir, config.model_copy(update={"max_processes": None}),
                               isolation)
        finally:
            subprocess.run(["docker", "rm", "-f", name], capture_output=True, timeout=60)


def docker_argv(argv: list[str], workdir: Path, config: SandboxConfig, name: str) -> list[str]:
    """The ``docker run`` command line for ``argv`` under ``config``."""
    ws = str(workdir)
    cmd = ["docker", "run", "--rm", "--name", name, "--network",
           "bridge" if config.network else "none", "--read-only", "--tmpfs", "/tmp:size=64m",
           "-v", f"{ws}:{ws}", "-w", ws, "--cap-drop", "ALL",
           "--security-opt", "no-new-privileges"]
    if config.max_processes is not None:
        cmd += ["--pids-limit", str(config.max_processes)]
    if config.memory_mb is not None:
        cmd += ["--memory", f"{config.memory_mb}m", "--memory-swap", f"{config.memory_mb}m"]
    if config.cpu_s is not None:
        cmd += ["--ulimit", f"cpu={config.cpu_s}"]
    if config.file_size_mb is not None:
        cmd += ["--ulimit", f"fsize={config.file_size_mb * 1024 * 1024}"]
    env = scrubbed_env(config, workdir)
    env.pop("PATH", None)
    for key in sorted(env):
        cmd += ["-e", f"{key}={env[key]}"]
    return [*cmd, config.docker_image, *argv]


@functools.cache
def docker_problem() -> str | None:
    """Why docker cannot run here, or None if it can (checked once per process)."""
    if shutil.which("docker") is None:
        return "docker not installed: see https://docs.docker.com/engine/install/"
    try:
        done = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"docker daemon not reachable: {err}"
    if done.returncode != 0:
        return "docker daemon not running: " + done.stderr.strip().splitlines()[-1][:300]
    return None
