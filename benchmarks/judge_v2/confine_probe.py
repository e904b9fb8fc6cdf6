"""Which part of the candidate's confinement does CUDA tolerate? Runs a CUDA start-up (and
one kernel) under each namespace and mount step alone, then all together, and prints a
table. GPU machine, repository root:

    PYTHONPATH=src python3 benchmarks/judge_v2/confine_probe.py
"""

from __future__ import annotations

import subprocess
import sys
import time

from cuda_agent.execution.sandbox_local import CONFINE, confine_argv, namespace_prefix

PROBE = ("import torch; torch.cuda.init(); x = torch.ones(4, device='cuda'); "
         "print('ok', torch.cuda.device_count(), float((x * 2).sum()))")
STEPS = {
    "remount-ro": 'for m in $(awk \'{print $5}\' /proc/self/mountinfo | sort -u); do '
                  'mount -o remount,bind,ro "$m"; done',
    "tmpfs-tmp": "mount -t tmpfs -o size=64m,nosuid,nodev tmpfs /tmp",
    "tmpfs-shm": "mount -t tmpfs -o size=64m,nosuid,nodev tmpfs /dev/shm",
    "setpriv": None,
}


def run(argv: list[str]) -> str:
    start = time.perf_counter()
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return "timeout"
    took = time.perf_counter() - start
    out = (done.stdout.strip().splitlines() or [""])[-1]
    if done.returncode == 0 and out.startswith("ok"):
        return f"ok ({took:.1f} s)"
    err = (done.stderr.strip().splitlines() or ["?"])[-1]
    return f"FAIL rc={done.returncode}: {err[:160]}"


def remount_except(prefixes: tuple[str, ...]) -> list[str]:
    """Remount every mount read-only except those under ``prefixes``."""
    skip = " ".join(f'"{p}"|"{p}"/*)' for p in prefixes)
    script = ('for m in $(awk \'{print $5}\' /proc/self/mountinfo | sort -u); do '
              f'case "$m" in {skip.replace(")", ") ;;", len(prefixes)) if prefixes else ""} '
              '*) mount -o remount,bind,ro "$m";; esac; done; exec "$@"')
    return ["unshare", "--mount", "--", "/bin/sh", "-c", script, "x"]


def main() -> int:
    py = [sys.executable, "-c", PROBE]
    if sys.argv[1:] == ["--ro-parts"]:
        for keep in (("/dev",), ("/proc",), ("/sys",), ("/dev", "/proc"), ("/dev", "/sys"),
                     ("/proc", "/sys")):
            print(f"ro except {' '.join(keep):24} {run(remount_except(keep) + py)}", flush=True)
        return 0
    user = namespace_prefix(network=False)
    print("namespace prefix:", user)
    rows = [("plain", py)]
    for flags in (["--mount"], ["--pid", "--fork", "--mount-proc"], ["--ipc"], ["--uts"],
                  ["--net"]):
        rows.append((" ".join(flags), ["unshare", *flags, "--", *py]))
    for name, step in STEPS.items():
        if step is None:
            cmd = ["unshare", "--mount", "--", "setpriv", "--bounding-set=-all",
                   "--inh-caps=-all", "--no-new-privs", "--", *py]
        else:
            cmd = ["unshare", "--mount", "--", "/bin/sh", "-c", f'{step} && exec "$@"', "x",
                   *py]
        rows.append((f"--mount + {name}", cmd))
    if user is not None:
        rows.append(("full confinement (init)", confine_argv(user, __import__("pathlib").Path(
            "/tmp"), [], [], init=True) + py))
    for name, argv in rows:
        print(f"{name:34} {run(argv)}", flush=True)
    print("CONFINE script:\n" + CONFINE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
