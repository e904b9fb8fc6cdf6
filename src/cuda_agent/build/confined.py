"""Run the compilers of a build confined: what they read, how long they live, what they use.

A candidate controls the sources a build compiles, and a source names files: ``#include
"/any/path"``, ``__has_include``, ``#embed``, the assembler's ``.incbin``. A source also
chooses how much time and memory the compiler spends (``#include "/dev/zero"``, template
and constexpr bombs) and how much it prints. So every compiler, assembler and linker
process of a build runs through a ``Jail``, which makes these properties hold:

- **What it reads.** The process runs in namespaces of its own (user, mount, pid): /tmp and
  /dev/shm are fresh and empty, so it sees the file system as the agent's own shell does
  (the judge's snapshots, other episodes' workspaces under /tmp and the judge's sockets are
  not there); only the folder it works in, read-only, and its own scratch folder, writable,
  are put back, with the Python environment and this package where they live under /tmp.
  /proc is the namespace's own, so no other process's files are reachable through it.
- **How long it lives.** Everything it starts dies when the command returns, times out or
  is killed, and when the judge itself dies: the namespace's first process is the command,
  the namespace dies with it, and ``unshare`` gets SIGKILL when its parent thread ends
  (``PR_SET_PDEATHSIG``). Without namespaces the process group is killed at the end and on
  timeout, but a compiler whose judge was SIGKILLed can outlive it blocked (a read that
  never ends uses no CPU, so ``RLIMIT_CPU`` does not end it); the next judge's sweep of
  dead judges' folders (``leftovers``) kills every process working in them.
- **What it may change.** Every mount is read-only but its scratch folder, and it runs with
  no capability, so it cannot undo that; its temporary files go to the scratch folder.
- **What it uses.** ``RLIMIT_AS`` bounds each process's memory, ``RLIMIT_FSIZE`` each file
  it writes (1 GiB), and the output kept is cut at ``output_bytes`` (the rest is read and
  dropped).

Where namespaces cannot be made (``confine='auto'``), the limits and the process-group kill
still hold and ``Jail.isolated`` is False; ``confine='on'`` refuses to build there.

    jail = Jail.make("auto", timeout_s=300, memory_bytes=4 << 30, expose=[venv])
    done = jail.run(["g++", "-c", "a.cpp", "-o", "/scratch/a.o"], cwd=root, scratch=scratch,
                    timeout_s=300)
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import resource
import selectors
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from cuda_agent.procs import die_with_parent

HIDDEN_ROOTS = ("/tmp/", "/dev/shm/")

# $1: the paths to show read-only, $2: the scratch folder (writable), $3: the working
# folder; one path per line. Every mount is made read-only first, and so are the kernel's
# settings under the namespace's own /proc (/proc/sys and the like, as the agent's shell
# has them). Paths under /tmp are bound under a fresh /dev/shm before /tmp is covered by a
# small tmpfs, then moved into it (mount --move keeps them), so /tmp and /dev/shm hold
# nothing else; the scratch folder is then made writable. The command runs with no
# capability left (an empty bounding set, no new privileges), so nothing it runs can undo a
# mount, and as the namespace's first process.
CONFINE = r"""set -eu
ro=$1; rw=$2; cwd=$3; shift 3
for m in $(awk '{print $5}' /proc/self/mountinfo | sort -u); do
  case "$m" in /proc|/proc/*) continue ;; esac
  mount -n -o remount,bind,ro "$m" ||
    { echo "build-confine: cannot make $m read-only" >&2; exit 125; }
done
for p in /proc/sys /proc/sysrq-trigger /proc/irq /proc/bus /proc/fs; do
  [ -e "$p" ] || continue
  mount -n --bind "$p" "$p" && mount -n -o remount,bind,ro "$p" ||
    { echo "build-confine: cannot make $p read-only" >&2; exit 125; }
done
mount -n -t tmpfs -o size=64m,nosuid,nodev tmpfs /dev/shm
n=0
IFS='
'
for p in $ro $rw; do
  case "$p" in /tmp/*|/dev/shm/*) ;; *) continue ;; esac
  n=$((n+1)); mkdir -p "/dev/shm/k$n"; mount -n --bind "$p" "/dev/shm/k$n"
done
mount -n -t tmpfs -o size=64m,nosuid,nodev tmpfs /tmp
n=0
for p in $ro $rw; do
  case "$p" in /tmp/*|/dev/shm/*) ;; *) continue ;; esac
  n=$((n+1)); mkdir -p "$p"; mount -n --move "/dev/shm/k$n" "$p"
done
for p in $rw; do
  case "$p" in /tmp/*|/dev/shm/*) ;; *) mount -n --bind "$p" "$p" ;; esac
  mount -n -o remount,bind,rw "$p"
done
unset IFS
cd "$cwd"
exec setpriv --bounding-set=-all --inh-caps=-all --no-new-privs -- "$@"
"""


class ConfinedBuildUnavailable(RuntimeError):
    """``confine='on'`` was asked for where the build's namespaces cannot be made."""


@dataclasses.dataclass(frozen=True)
class Ran:
    """What one confined command did; ``output`` is stdout and stderr together, cut."""

    code: int
    output: str
    timed_out: bool


@dataclasses.dataclass(frozen=True)
class Jail:
    """How a build's processes run: namespaces (``isolated``) and per-process limits."""

    isolated: bool
    expose: tuple[str, ...] = ()
    """Paths under /tmp or /dev/shm every command may read (the Python environment...)."""
    cpu_s: int | None = None
    memory_bytes: int | None = None
    file_bytes: int | None = 1 << 30
    output_bytes: int = 1 << 20

    @classmethod
    def make(cls, confine: str, timeout_s: float, memory_bytes: int | None,
             expose: Iterable[str | Path] = ()) -> Jail:
        """The jail for ``confine`` ('auto' | 'on' | 'off'): namespaces where they work
        ('auto'), required ('on') or never ('off'; the limits still apply)."""
        isolated = confine != "off" and namespaces_work()
        if confine == "on" and not isolated:
            raise ConfinedBuildUnavailable(
                "build.confine='on' but user/mount/pid namespaces cannot be made here "
                "(needs util-linux unshare and root or unprivileged user namespaces)")
        paths = [*expose, sys.prefix, sys.base_prefix, Path(__file__).resolve().parents[2]]
        return cls(isolated, _hidden(paths), int(timeout_s) + 5, memory_bytes)

    def start(self, argv: Sequence[str], cwd: Path, scratch: Path,
              env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        """Start ``argv`` in ``cwd`` (read-only) with ``scratch`` writable; its output
        (stdout and stderr together) is the pipe ``proc.stdout``; read it with ``drain``."""
        cwd, scratch = Path(cwd).resolve(), Path(scratch).resolve()
        # temporary files (cc1plus's assembly, nvcc's stages) go to the scratch folder, on
        # disk and under RLIMIT_FSIZE, not to a tmpfs that is memory no limit counts
        env = dict(os.environ if env is None else env)
        if not Path(env.get("TMPDIR", "/")).resolve().is_relative_to(scratch):
            env["TMPDIR"] = str(scratch)
        if self.isolated:
            ro = "\n".join([str(cwd), *(p for p in self.expose if p != str(cwd))])
            rw = str(scratch)
            if any("\n" in str(p) for p in (cwd, scratch)):
                raise ValueError("a build path holds a newline")
            argv = [*_prefix(), "/bin/sh", "-c", CONFINE, "build-confine", ro, rw, str(cwd),
                    *argv]
        return subprocess.Popen(list(argv), cwd=scratch if self.isolated else cwd, env=env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=self._limits())

    def run(self, argv: Sequence[str], cwd: Path, scratch: Path, timeout_s: float,
            env: dict[str, str] | None = None) -> Ran:
        """Run ``argv`` to its end or ``timeout_s``; nothing it started outlives this call."""
        proc = self.start(argv, cwd, scratch, env)
        deadline = time.monotonic() + timeout_s
        try:
            output = drain(proc, self.output_bytes, deadline)
            timed_out = output is None
        finally:
            kill(proc)
        return Ran(proc.returncode if not timed_out else -9, output or "", timed_out)

    def _limits(self):
        limits = [(resource.RLIMIT_CORE, 0)]
        if self.cpu_s is not None:
            limits.append((resource.RLIMIT_CPU, self.cpu_s))
        if self.memory_bytes is not None:
            limits.append((resource.RLIMIT_AS, self.memory_bytes))
        if self.file_bytes is not None:
            limits.append((resource.RLIMIT_FSIZE, self.file_bytes))
        die = die_with_parent()

        def apply() -> None:  # in the child, before exec: nothing here may allocate locks
            die()
            for which, value in limits:
                resource.setrlimit(which, (value, value))

        return apply


def drain(proc: subprocess.Popen[bytes], limit: int, deadline: float) -> str | None:
    """The process's output up to ``limit`` bytes (the rest read and dropped, so it never
    blocks on a full pipe) once it exits; None if ``deadline`` passes first."""
    assert proc.stdout is not None
    kept, cut = bytearray(), False
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            if not sel.select(timeout=min(left, 1.0)):
                continue
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                break
            room = limit - len(kept)
            cut = cut or len(chunk) > room
            kept += chunk[:max(room, 0)]
    try:
        proc.wait(timeout=max(deadline - time.monotonic(), 0.01))
    except subprocess.TimeoutExpired:
        return None
    text = kept.decode(errors="replace")
    return text + (f"\n[output cut at {limit} bytes]\n" if cut else "")


def kill(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the command's process group (its namespace dies with its first process)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


@functools.cache
def namespaces_work() -> bool:
    """Whether a build's namespaces can be made here (checked once per process)."""
    if not all(shutil.which(tool) for tool in ("unshare", "setpriv", "awk")):
        return False
    try:
        done = subprocess.run([*_prefix(), "/bin/sh", "-c", CONFINE, "probe", "", "", "/",
                               "true"], capture_output=True, timeout=30, cwd="/")
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def _prefix() -> list[str]:
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    return ["unshare", *user, "--mount", "--pid", "--fork", "--kill-child", "--mount-proc",
            "--net", "--ipc", "--uts", "--"]


def _hidden(paths: Iterable[str | Path]) -> tuple[str, ...]:
    out: list[str] = []
    for raw in paths:
        path = str(Path(raw).resolve())
        if path.startswith(HIDDEN_ROOTS) and path not in out and Path(path).exists():
            out.append(path)
    return tuple(out)

