"""Sandbox for the agent's shell commands: one interface, three backends.

    from cuda_agent.execution import SandboxConfig, make_sandbox
    result = make_sandbox(SandboxConfig(timeout_s=30)).run("make && ./bench", workspace)

Every backend runs the command with the workspace as its working directory, in its own
session and process group, with a scrubbed environment (only ``env_allow`` names pass, HOME
is the workspace), with RLIMIT_CPU / RLIMIT_AS / RLIMIT_FSIZE / RLIMIT_NPROC / RLIMIT_CORE=0,
captured output cut at ``output_limit_bytes``, and kills the whole group with SIGKILL on
timeout and after a normal exit (no leftovers).

What each backend has (H) and lacks (-) on Linux; "measured" = checked by
tests/execution/test_sandbox.py on the development container (root, cgroup v1):

    property                   local                    bwrap                docker*
    workspace-only writes      H mount ns, / ro         H --ro-bind /        H only the -v mount
    own /tmp, /dev/shm         H tmpfs 64 MB            H tmpfs              H tmpfs /tmp
    no network (network=False) H net ns (unshare --net) H --unshare-all      H --network none
    process-count cap          H pids cgroup, else poll H pids cgroup/poll   H --pids-limit
    memory / CPU / file size   H rlimits                H rlimits            H --memory, ulimit
    kill all on timeout/exit   H pid ns, killpg, cgroup H same + die-w-parent H docker rm -f
    no capabilities            H setpriv, empty set     H --cap-drop ALL     H --cap-drop ALL
    hides other files (reads)  - all of / is readable   - all of / readable  H image only
    GPU access                 H host /dev              H /dev/nvidia* bound - needs --gpus

    * docker: argv unit-tested only; no daemon ran where the tests were written.

The local backend needs ``unshare``/``setpriv`` (util-linux) and root or unprivileged user
namespaces; where namespaces are unavailable it still runs the command but
``CommandResult.isolation`` says what was not enforced (writes outside the workspace and the
network are then NOT blocked). RLIMIT_NPROC does not bind root, so the process-count cap is a
pids cgroup (v1 or v2) when one is writable, otherwise a 20 ms poll of the session that kills
the command once it has more than ``max_processes`` processes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Literal, Protocol

from pydantic import BaseModel, Field

from cuda_agent.procs import session_members

DEFAULT_ENV_ALLOW = (
    "PATH", "LANG", "LC_*", "TERM", "TZ", "CUDA_VISIBLE_DEVICES", "CUDA_HOME", "CUDA_PATH",
    "NVIDIA_*", "LD_LIBRARY_PATH", "TORCH_*", "PYTORCH_*", "CC", "CXX",
    "VIRTUAL_ENV", "PYTHONPATH",
)


class SandboxConfig(BaseModel):
    """Limits and isolation for one agent command; one section ``sandbox:`` in the YAML."""

    backend: Literal["local", "bwrap", "docker"] = Field(
        "local", description="local: namespaces + rlimits; bwrap: bubblewrap; docker: container")
    timeout_s: float = Field(120.0, gt=0, description="Wall-clock limit; the group is killed after")
    cpu_s: int | None = Field(600, description="RLIMIT_CPU seconds per process (None: no limit)")
    memory_mb: int | None = Field(
        None, description="RLIMIT_AS per process in MiB; None by default because CUDA reserves "
        "tens of GiB of virtual address space, so set it only for CPU-only commands")
    file_size_mb: int | None = Field(
        1024, description="RLIMIT_FSIZE: largest file a process may write, MiB (also stdout)")
    max_processes: int | None = Field(
        256, description="Most processes/threads the command may have at once (pids cgroup, "
        "RLIMIT_NPROC, or a poll that kills the command when over)")
    ro_paths: tuple[str, ...] = Field(
        (), description="Paths under /tmp or /dev/shm to keep visible (read-only) inside the "
        "sandbox's private /tmp; the Python environment and this package are added "
        "automatically when they live there")
    network: bool = Field(False, description="Allow network access (False: own empty net ns)")
    env_allow: tuple[str, ...] = Field(
        DEFAULT_ENV_ALLOW, description="Environment names (fnmatch patterns) passed through; "
        "everything else is dropped and HOME/TMPDIR are set to the workspace and /tmp")
    env_set: dict[str, str] = Field(
        default_factory=dict, description="Names set in every command's environment after "
        "the scrub (the episode's judge, say)")
    output_limit_bytes: int = Field(
        1_000_000, gt=0, description="Captured stdout and stderr are each cut to this size")
    docker_image: str = Field(
        "python:3.11-slim", description="Image for the docker backend")


@dataclasses.dataclass(frozen=True)
class CommandResult:
    """What one sandboxed command did."""

    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool
    killed_reason: str | None  # "timeout", "process limit", or None
    seconds: float
    truncated: bool
    isolation: tuple[str, ...] = ()  # protections actually in force, e.g. ("net", "mount")


class Sandbox(Protocol):
    """Runs one shell command (str) or argv (list) in ``workdir`` under ``config``."""

    def run(self, command: str | list[str], workdir: Path,
            config: SandboxConfig) -> CommandResult: ...


class SandboxUnavailable(RuntimeError):
    """The chosen backend cannot run here; the message says what is missing."""


def make_sandbox(config: SandboxConfig) -> Sandbox:
    """The backend named by ``config.backend``; raises SandboxUnavailable if it cannot run."""
    if config.backend == "local":
        from cuda_agent.execution.sandbox_local import LocalSandbox
        return LocalSandbox()
    if config.backend == "bwrap":
        from cuda_agent.execution.sandbox_bwrap import BwrapSandbox, bwrap_problem
        problem = bwrap_problem()
        if problem:
            raise SandboxUnavailable(problem)
        return BwrapSandbox()
    if config.backend == "docker":
        from cuda_agent.execution.sandbox_docker import DockerSandbox, docker_problem
        problem = docker_problem()
        if problem:
            raise SandboxUnavailable(problem)
        return DockerSandbox()
    raise SandboxUnavailable(f"unknown sandbox backend {config.backend!r}")


def as_argv(command: str | list[str]) -> list[str]:
    """A shell string runs under /bin/sh -c; a list is the argv itself."""
    return ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)


def scrubbed_env(config: SandboxConfig, workdir: Path,
                 parent: dict[str, str] | None = None) -> dict[str, str]:
    """Only the allowed names from ``parent`` (default os.environ); HOME is the workspace."""
    parent = dict(os.environ) if parent is None else parent
    env = {k: v for k, v in parent.items()
           if any(fnmatch.fnmatchcase(k, pat) for pat in config.env_allow)}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env.update(HOME=str(workdir), TMPDIR="/tmp", PWD=str(workdir))
    env.update(config.env_set)
    return env


def rlimit_setter(config: SandboxConfig) -> Callable[[], None]:
    """A preexec_fn that applies the config's rlimits in the child before exec."""
    mib = 1024 * 1024
    limits = [(resource.RLIMIT_CORE, 0)]
    if config.cpu_s is not None:
        limits.append((resource.RLIMIT_CPU, config.cpu_s))
    if config.memory_mb is not None:
        limits.append((resource.RLIMIT_AS, config.memory_mb * mib))
    if config.file_size_mb is not None:
        limits.append((resource.RLIMIT_FSIZE, config.file_size_mb * mib))
    if config.max_processes is not None:
        limits.append((resource.RLIMIT_NPROC, config.max_processes))

    def apply() -> None:
        for which, value in limits:
            resource.setrlimit(which, (value, value))

    return apply


def run_process(argv: list[str], workdir: Path, config: SandboxConfig,
                isolation: tuple[str, ...] = ()) -> CommandResult:
    """Run ``argv`` in its own session with rlimits and a pids cgroup; kill all of it after."""
    start = time.monotonic()
    cgroup = PidsCgroup.create(config.max_processes)
    limits = rlimit_setter(config)

    def preexec() -> None:
        if cgroup is not None:
            cgroup.enter()
        limits()

    isolation += ("pids-cgroup",) if cgroup else ("pids-poll",) if config.max_processes else ()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            argv, cwd=workdir, env=scrubbed_env(config, workdir), stdin=subprocess.DEVNULL,
            stdout=out, stderr=err, start_new_session=True, preexec_fn=preexec)
        try:
            reason = _wait(proc, config, poll_pids=cgroup is None)
        finally:
            _kill_session(proc.pid)
            if cgroup is not None:
                cgroup.kill_and_remove()
            proc.wait()
        stdout, cut_out = _read_capped(out, config.output_limit_bytes)
        stderr, cut_err = _read_capped(err, config.output_limit_bytes)
    return CommandResult(
        exit_code=proc.returncode, stdout=stdout, stderr=stderr, timed_out=reason == "timeout",
        killed_reason=reason, seconds=time.monotonic() - start, truncated=cut_out or cut_err,
        isolation=isolation)


def _wait(proc: subprocess.Popen, config: SandboxConfig, poll_pids: bool) -> str | None:
    deadline = time.monotonic() + config.timeout_s
    while True:
        try:
            proc.wait(timeout=0.02)
            return None
        except subprocess.TimeoutExpired:
            pass
        if time.monotonic() >= deadline:
            return "timeout"
        cap = config.max_processes
        if poll_pids and cap is not None and len(session_members(proc.pid)) > cap:
            return "process limit"


def _kill_session(sid: int) -> None:
    """SIGKILL the process group, then anything left in the session (until none are)."""
    for _ in range(50):
        victims = session_members(sid)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(sid, signal.SIGKILL)
        for pid in victims:
            _sigkill(pid)
        if not victims:
            return
        time.sleep(0.01)


def _read_capped(file, limit: int) -> tuple[str, bool]:
    file.seek(0)
    data = file.read(limit + 1)
    return data[:limit].decode(errors="replace"), len(data) > limit


@dataclasses.dataclass(frozen=True)
class PidsCgroup:
    """A fresh pids cgroup (v1 or v2) whose pids.max caps the command's processes."""

    path: Path

    @classmethod
    def create(cls, max_processes: int | None) -> PidsCgroup | None:
        """A new cgroup with pids.max set, or None if no writable pids controller exists."""
        if max_processes is None:
            return None
        for base in (Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup")):
            path = base / f"cuda-agent-sandbox-{uuid.uuid4().hex[:12]}"
            try:
                path.mkdir()
            except OSError:
                continue
            try:
                (path / "pids.max").write_text(str(max_processes))
                return cls(path)
            except OSError:
                path.rmdir()
        return None

    def enter(self) -> None:
        """Move the calling process (the child, in preexec_fn) into the cgroup."""
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def kill_and_remove(self) -> None:
        """SIGKILL every member until the cgroup is empty, then delete it."""
        for _ in range(200):
            pids = [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
            if not pids:
                break
            for pid in pids:
                _sigkill(pid)
            time.sleep(0.01)
        with contextlib.suppress(OSError):
            self.path.rmdir()


def _sigkill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def hidden_needs(config: SandboxConfig) -> list[str]:
    """Paths the command needs that the private /tmp or /dev/shm would hide: the configured
    ``ro_paths`` plus this interpreter's environment and this package, where they live
    there (e.g. a checkout under /tmp)."""
    import cuda_agent

    wanted = [*config.ro_paths, sys.prefix, sys.base_prefix,
              str(Path(cuda_agent.__file__).resolve().parents[1])]
    out: list[str] = []
    for raw in wanted:
        path = str(Path(raw).resolve())
        if path.startswith(("/tmp/", "/dev/shm/")) and path not in out and Path(path).exists():
            out.append(path)
    return out
