"""One adversarial test per sandbox property, with real processes, for each backend that runs
here (local always; bwrap if installed; docker only with a daemon). Where cheap, the same
attack is first shown to succeed under a naive ``subprocess.run(shell=True)``."""

from __future__ import annotations

import http.server
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

from cuda_agent.execution import (
    SandboxConfig,
    SandboxUnavailable,
    make_sandbox,
    sandbox_bwrap,
    sandbox_docker,
)
from cuda_agent.execution import sandbox as sandbox_mod

BACKENDS = ["local", "bwrap"]


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    try:
        make_sandbox(SandboxConfig(backend=request.param))
    except SandboxUnavailable as err:
        pytest.skip(str(err))
    return request.param


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    path = tmp_path / "ws"
    path.mkdir()
    return path


def run(backend: str, command, ws: Path, **config):
    cfg = SandboxConfig(backend=backend, **{"timeout_s": 20, **config})
    return make_sandbox(cfg).run(command, ws, cfg)


def processes_with(marker: str) -> list[str]:
    """Command lines of live processes that mention ``marker``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            cmdline = stat.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline and "pytest" not in cmdline:
            found.append(cmdline)
    return found


def test_escape_workspace(backend, ws, tmp_path):
    outside = [tmp_path / "outside.txt", tmp_path / "abs.txt",
               Path(f"/tmp/sandbox-escape-{uuid.uuid4().hex}")]
    attack = f"echo x > ../outside.txt; echo x > {outside[1]}; echo x > {outside[2]}; " \
             "echo ok > inside.txt; cd / && echo x > /escape-root.txt"
    subprocess.run(attack, shell=True, cwd=ws, capture_output=True)
    assert all(p.exists() for p in outside), "the naive run should escape"
    for p in [*outside, ws / "inside.txt"]:
        p.unlink()
    Path("/escape-root.txt").unlink(missing_ok=True)

    result = run(backend, attack, ws)
    assert not any(p.exists() for p in outside)
    assert not Path("/escape-root.txt").exists()
    assert (ws / "inside.txt").read_text() == "ok\n"
    assert "mount" in result.isolation


def test_kernel_settings_stay_read_only(backend, ws):
    """/proc stays writable for CUDA, but not the kernel's settings under /proc/sys."""
    setting = Path("/proc/sys/vm/swappiness")
    attack = f"cat {setting} > value && cat value > {setting} && echo changed"
    naive = subprocess.run(attack, shell=True, cwd=ws, capture_output=True, text=True)
    if "changed" not in naive.stdout:
        pytest.skip("this user cannot write kernel settings even without a sandbox")
    result = run(backend, attack, ws)
    assert "changed" not in result.stdout, result
    assert result.exit_code != 0


@pytest.mark.parametrize("cap", ["cgroup", "poll"])
def test_fork_bomb_contained(backend, ws, cap, monkeypatch):
    made = []  # this test's cgroups (tests running beside it may hold their own)
    create = sandbox_mod.PidsCgroup.create.__func__

    def recorded(cls, n):
        group = None if cap == "poll" else create(cls, n)
        made.extend([group.path] if group else [])
        return group

    monkeypatch.setattr(sandbox_mod.PidsCgroup, "create", classmethod(recorded))
    marker = f"forkbomb{uuid.uuid4().hex}"
    bomb = (f"# {marker}\nimport os, sys, time\nn = 0\ntry:\n"
            "    for _ in range(10_000):\n"
            "        if os.fork() == 0:\n            time.sleep(30)\n            os._exit(0)\n"
            "        n += 1\nexcept OSError:\n    print('forked', n)\n    sys.exit(3)\n")
    result = run(backend, [sys.executable, "-c", bomb], ws, max_processes=64)
    if cap == "cgroup":
        assert result.exit_code == 3 and "pids-cgroup" in result.isolation
        assert int(result.stdout.split()[1]) < 64
    else:
        assert result.killed_reason == "process limit"
    assert processes_with(marker) == []
    assert len(made) == (cap == "cgroup") and not any(path.exists() for path in made)


def test_fill_disk_stops_at_file_size_limit(backend, ws):
    result = run(backend, "head -c 1073741824 /dev/zero > big.bin", ws, file_size_mb=10)
    assert result.exit_code != 0
    assert (ws / "big.bin").stat().st_size <= 10 * 1024 * 1024


@pytest.mark.serial
def test_hang_killed_with_grandchildren(backend, ws):
    marker = f"98{uuid.uuid4().int % 10**6}"
    result = run(backend, f"sleep {marker}.1 & setsid sleep {marker}.2 & sleep {marker}.3",
                 ws, timeout_s=2)
    assert result.timed_out and result.killed_reason == "timeout"
    assert result.seconds < 4
    assert processes_with(marker) == []


def test_leftovers_killed_after_normal_exit(backend, ws):
    marker = f"97{uuid.uuid4().int % 10**6}"
    result = run(backend, f"setsid sleep {marker} & sleep {marker}.5 & echo done", ws)
    assert result.exit_code == 0 and result.stdout == "done\n"
    assert processes_with(marker) == []


@pytest.fixture
def http_url():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


def test_network(backend, ws, http_url):
    fetch = [sys.executable, "-c",
             f"import urllib.request; print(urllib.request.urlopen('{http_url}').status)"]
    assert subprocess.run(fetch, capture_output=True, text=True).stdout == "200\n"
    blocked = run(backend, fetch, ws, network=False)
    assert blocked.exit_code != 0 and "URLError" in blocked.stderr  # refused or unreachable
    assert "net" in blocked.isolation
    allowed = run(backend, fetch, ws, network=True)
    assert allowed.exit_code == 0 and allowed.stdout == "200\n"


def test_env_scrubbed(backend, ws, monkeypatch):
    monkeypatch.setenv("CUDA_AGENT_TEST_SECRET", "s3cret")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    command = "echo \"[$CUDA_AGENT_TEST_SECRET] $HOME $CUDA_VISIBLE_DEVICES\""
    assert "s3cret" in subprocess.run(command, shell=True, capture_output=True, text=True).stdout
    result = run(backend, command, ws)
    assert result.stdout == f"[] {ws} 0\n"


def test_output_truncated(backend, ws):
    result = run(backend, "head -c 100000 /dev/zero | tr '\\0' a; echo err >&2", ws,
                 output_limit_bytes=1000)
    assert result.stdout == "a" * 1000 and result.truncated and result.stderr == "err\n"


def test_memory_limit(backend, ws):
    grab = [sys.executable, "-c", "b = bytearray(2 * 1024**3); print('got it')"]
    result = run(backend, grab, ws, memory_mb=256)
    assert result.exit_code != 0 and "MemoryError" in result.stderr


def test_bwrap_argv():
    argv = sandbox_bwrap.bwrap_argv(["make"], Path("/w/ep1"), network=False,
                                    gpu_devices=["/dev/nvidia0"])
    joined = " ".join(argv)
    assert argv[0] == "bwrap" and argv[-2:] == ["--", "make"]
    for part in ["--ro-bind / /", "--bind /w/ep1 /w/ep1", "--tmpfs /tmp", "--unshare-all",
                 "--die-with-parent", "--chdir /w/ep1", "--dev-bind /dev/nvidia0 /dev/nvidia0"]:
        assert part in joined
    assert "--share-net" not in argv
    assert "--share-net" in sandbox_bwrap.bwrap_argv(["make"], Path("/w"), True, [])


def test_bwrap_missing_names_the_fix(monkeypatch):
    sandbox_bwrap.bwrap_problem.cache_clear()
    monkeypatch.setattr(sandbox_bwrap.shutil, "which", lambda name: None)
    with pytest.raises(SandboxUnavailable, match="apt install bubblewrap"):
        make_sandbox(SandboxConfig(backend="bwrap"))
    sandbox_bwrap.bwrap_problem.cache_clear()


def test_docker_argv():
    cfg = SandboxConfig(backend="docker", memory_mb=512, max_processes=32, file_size_mb=10,
                        cpu_s=60, docker_image="img:1")
    argv = sandbox_docker.docker_argv(["sh", "-c", "make"], Path("/w/ep1"), cfg, "box")
    joined = " ".join(argv)
    for part in ["--rm", "--network none", "-v /w/ep1:/w/ep1", "-w /w/ep1", "--memory 512m",
                 "--pids-limit 32", "--ulimit cpu=60", "--ulimit fsize=10485760",
                 "--cap-drop ALL", "--read-only", "-e HOME=/w/ep1"]:
        assert part in joined
    assert argv[-4:] == ["img:1", "sh", "-c", "make"]


def test_docker_unavailable_is_explained(monkeypatch):
    problem = sandbox_docker.docker_problem()
    if problem is None:
        pytest.skip("docker runs here")
    with pytest.raises(SandboxUnavailable, match="docker"):
        make_sandbox(SandboxConfig(backend="docker"))


def test_docker_runs_confined(ws):
    problem = sandbox_docker.docker_problem()
    if problem:
        pytest.skip(problem)
    cfg = SandboxConfig(backend="docker", timeout_s=60)
    result = make_sandbox(cfg).run("echo ok > inside.txt && pwd", ws, cfg)
    assert result.exit_code == 0 and (ws / "inside.txt").exists()
