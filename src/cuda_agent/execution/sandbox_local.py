"""Local backend: util-linux ``unshare`` namespaces + rlimits + a pids cgroup, no daemon.

The command runs as ``unshare --mount --pid --fork --kill-child --mount-proc --ipc --uts
[--net] -- sh CONFINE WORKSPACE argv...``. CONFINE remounts every mount read-only (but the
namespace's own /proc, which CUDA needs to write; its /proc/sys, sysrq-trigger, irq, bus and
fs stay read-only), puts fresh tmpfs over /tmp and /dev/shm, binds the workspace back
read-write, and execs the command through ``setpriv`` with an empty capability bounding
set, so even root inside cannot undo the mounts. The pid namespace means every process of
the command dies with it.

As a non-root user the same runs inside a user namespace (``unshare -r``). If no namespace
can be made, the command still runs with rlimits, its own session and the cgroup/poll cap,
and ``CommandResult.isolation`` lacks "mount" and "net": writes outside the workspace and
the network are then NOT blocked.
"""

from __future__ import annotations

import functools
import os
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

CONFINE = r"""set -eu
ws=$1; keep=$2; rw=$3; init=$4; shift 4
cd "$ws"
for m in $(awk '{print $5}' /proc/self/mountinfo | sort -u); do
  case "$m" in /proc|/proc/*) continue ;; esac
  mount -o remount,bind,ro "$m" || { echo "sandbox: cannot make $m read-only" >&2; exit 125; }
done
for p in /proc/sys /proc/sysrq-trigger /proc/irq /proc/bus /proc/fs; do
  [ -e "$p" ] || continue
  mount --bind "$p" "$p" && mount -o remount,bind,ro "$p" ||
    { echo "sandbox: cannot make $p read-only" >&2; exit 125; }
done
mount --rbind / /mnt
mount -t tmpfs -o size=64m,nosuid,nodev tmpfs /tmp
mount -t tmpfs -o size=64m,nosuid,nodev tmpfs /dev/shm
IFS=:
for p in $keep; do
  mkdir -p "$p"
  mount --bind "/mnt$p" "$p"
  mount -o remount,bind,ro "$p"
done
for p in $rw; do
  mkdir -p "$p"
  mount --bind "/mnt$p" "$p"
  mount -o remount,bind,rw "$p"
done
unset IFS
umount -l /mnt
mkdir -p "$ws"
mount -c --bind . "$ws"
mount -c -o remount,bind,rw "$ws"
cd "$ws"
if [ "$init" = 1 ]; then
  setpriv --bounding-set=-all --inh-caps=-all --no-new-privs -- "$@" && exit 0 || exit $?
fi
exec setpriv --bounding-set=-all --inh-caps=-all --no-new-privs -- "$@"
"""


class LocalSandbox:
    """Runs commands on this machine, confined by namespaces where the OS allows."""

    def run(self, command: str | list[str], workdir: Path,
            config: SandboxConfig) -> CommandResult:
        workdir = Path(workdir).resolve()
        prefix = namespace_prefix(network=config.network)
        if prefix is None:
            return run_process(as_argv(command), workdir, config)
        argv = confine_argv(prefix, workdir, hidden_needs(config))
        isolation = ("mount", "pid", "caps") + (() if config.network else ("net",))
        return run_process(argv + as_argv(command), workdir, config, isolation)


def confine_argv(prefix: list[str], workdir: Path, keep: list[str], rw: list[str] = (),
                 init: bool = False) -> list[str]:
    """The argv (to which the command's own argv is appended) that runs a command confined:
    ``prefix`` from ``namespace_prefix``; ``workdir`` writable and the working directory;
    ``keep`` re-exposed read-only and ``rw`` read-write (paths the private /tmp would hide,
    or any path to make writable). With ``init`` a shell stays as the namespace's first
    process and the command runs as its child, so the command gets ordinary signal
    semantics (a namespace's init ignores signals it has no handler for); a command killed
    by signal N then exits with status 128 + N."""
    return [*prefix, "/bin/sh", "-c", CONFINE, "sandbox-confine", str(workdir),
            ":".join(keep), ":".join(rw), "1" if init else "0"]


def namespace_prefix(network: bool) -> list[str] | None:
    """The ``unshare`` argv that confines a command here, or None if namespaces fail."""
    if not namespaces_work():
        return None
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    net = [] if network else ["--net"]
    return ["unshare", *user, "--mount", "--pid", "--fork", "--kill-child", "--mount-proc",
            "--ipc", "--uts", *net, "--"]


@functools.cache
def namespaces_work() -> bool:
    """Whether the full confinement runs here (checked once per process)."""
    if not (shutil.which("unshare") and shutil.which("setpriv") and shutil.which("awk")):
        return False
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    probe = ["unshare", *user, "--mount", "--pid", "--fork", "--kill-child", "--mount-proc",
             "--ipc", "--uts", "--net", "--", "/bin/sh", "-c", CONFINE, "probe", "/", "", "",
             "0", "true"]
    try:
        done = subprocess.run(probe, capture_output=True, timeout=10, cwd="/")
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0
