"""The episode's warm judge: one server per workspace, shared by the agent's tools and the
shell, surviving bad clients and hostile candidates, ended with its episode."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from cuda_agent.agent.tools import Toolbox
from cuda_agent.execution.warm_judge import (
    ENV,
    WarmJudge,
    WarmJudgeError,
    address,
    episode_configs,
    run_dir,
)
from cuda_agent.judge import baselines as baseline_cache
from cuda_agent.judge.measure import baseline_key
from cuda_agent.tasks import load_task
from cuda_agent.workspace import init_workspace, read_workspace
from tests.conftest import write_solution

QUICK = {"trials": 1, "scales": [], "min_runs": 5, "time_compile": False}


def timed_config():
    return episode_configs("cpu", QUICK)["profile"]


@pytest.fixture(scope="module")
def _pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.conftest import SCALE_ADD_TASK

    task = tmp_path_factory.mktemp("task") / "scale_add.py"
    task.write_text(SCALE_ADD_TASK + f"\n# {uuid.uuid4().hex}\n")  # baselines of its own
    root = init_workspace(load_task(str(task)), tmp_path_factory.mktemp("p") / "ws", "cpu")
    write_solution(root)
    return root


@pytest.fixture
def workspace(tmp_path: Path, _pristine: Path) -> Path:
    import shutil

    root = tmp_path / "ws"
    shutil.copytree(_pristine, root, symlinks=True)
    return root


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory, _pristine: Path) -> Iterator[WarmJudge]:
    """One owner's server on a workspace of its own, for the cases that need no server of
    their own; each leaves the honest solution in the workspace."""
    import shutil

    root = tmp_path_factory.mktemp("shared") / "ws"
    shutil.copytree(_pristine, root, symlinks=True)
    judge = WarmJudge(root, episode_configs("cpu", QUICK), owner=True)
    try:
        yield judge
    finally:
        judge.close()


def _gone(pid: int) -> bool:
    """Whether ``pid`` ended, waiting as long as it takes a loaded machine (bounded)."""
    for _ in range(1200):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):  # ended; its parent has not reaped it yet
            return True
        time.sleep(0.1)
    return False


def _raw(path: Path, payload: bytes) -> dict:
    with socket.socket(socket.AF_UNIX) as conn:
        conn.connect(str(path))
        conn.sendall(payload)
        conn.shutdown(socket.SHUT_WR)
        return json.loads(b"".join(iter(lambda: conn.recv(65536), b"")))


def test_calls_share_one_server_that_survives_bad_clients_and_a_crashing_candidate(
        workspace: Path) -> None:
    judge = WarmJudge(workspace, episode_configs("cpu", QUICK), owner=True)
    try:
        first = judge.call("verify")
        assert first.correct and first.reward == 1, first.reasons
        server = judge.ping()
        assert server is not None and server["judged"] == 1
        for payload in (b"not json\n", b"[1, 2]\n", b"{" + b" " * 70_000, b'{"op": [0]}\n',
                        b'{"op": "stop", "token": "\xc3\xa9"}\n',
                        b'{"op": "rm -rf"}\n', b'{"op": "verify", "workspace": "/"}\n',
                        b'{"op": "stop"}\n', b'{"op": "stop", "token": "guess"}\n'):
            try:
                reply = _raw(judge.socket, payload)
            except ConnectionResetError:  # closed with the oversize request unread
                assert len(payload) > 65536
                continue
            assert reply["ok"] is False and reply["error"], payload
        (workspace / "model_new.py").write_text(
            "import os\nos.kill(os.getpid(), 11)\n")  # the candidate's process dies
        crashed = judge.call("verify")
        assert crashed.reward < 1 and not crashed.correct
        write_solution(workspace)
        timed = judge.call("profile")
        assert timed.correct and timed.runtime_ms is not None
        # what an episode's own call measured stays with its judge: no reward reads it
        assert baseline_cache.load(baseline_key(read_workspace(workspace).task,
                                                timed_config(), "cpu")) is None
        for _ in range(3):  # asked and gone: not judged
            with socket.socket(socket.AF_UNIX) as conn:
                conn.connect(str(judge.socket))
                conn.sendall(json.dumps({"op": "verify", "workspace": str(workspace)}
                                        ).encode() + b"\n")
        again = judge.ping()
        assert again is not None and again["pid"] == server["pid"]
        assert 3 <= again["judged"] <= 4  # at most the one already under way
    finally:
        judge.close()
    assert _gone(server["pid"]) and not judge.socket.exists()


def test_no_candidate_can_reach_a_judge_server(shared: WarmJudge) -> None:
    """The sockets live where a confined process sees a fresh /tmp: a candidate judged by
    the warm judge itself finds neither its socket nor their folder."""
    shared.start()
    names = [str(shared.socket), str(shared.socket.parent)]
    assert all(Path(name).exists() for name in names)
    try:
        (shared.root / "model_new.py").write_text(
            f"import os\nseen = [p for p in {names!r} if os.path.exists(p)]\n"
            f"raise SystemExit('candidate sees ' + repr(seen))\n\n\nclass ModelNew:\n"
            f"    pass\n")
        result = shared.call("verify")
        if result.isolation != "namespaces":
            pytest.skip(f"no namespaces here: {result.isolation!r} {result.reasons}")
        assert "candidate sees []" in " ".join(result.reasons), result.reasons
    finally:
        write_solution(shared.root)


def test_a_server_that_died_is_started_again_and_the_call_still_answered(
        shared: WarmJudge) -> None:
    shared.start()
    pid = shared.ping()["pid"]
    os.kill(pid, signal.SIGKILL)
    assert _gone(pid)
    result = shared.call("verify")
    assert result.correct
    assert shared.ping()["pid"] != pid


def test_the_shell_and_the_tools_reach_the_same_judge_which_ends_with_the_episode(
        workspace: Path) -> None:
    box = Toolbox(workspace)
    box.config.judge.update(QUICK)
    shell = box.call("shell", {"command": "utils/verify"}, "")
    assert shell.ok, shell.output
    tool = box.call("verify", {}, "")
    assert tool.ok, tool.output
    server = box._warm.ping()
    assert server is not None and server["judged"] == 2  # one server answered both
    seen = box.call("shell", {"command": f"ls -a {run_dir()}"}, "")
    names = set(seen.output.split()) - {".", "..", "---", "stdout", "exit", "code", "0"}
    assert names == {address(workspace).parent.name}, seen.output  # its own socket alone
    box.close()
    assert _gone(server["pid"])
    # the agent's shell cannot start one of its own: it is told how to get one
    env = {**os.environ, ENV: str(address(workspace)), "COLUMNS": "400"}
    done = subprocess.run([sys.executable, "-m", "cuda_agent", "workspace", "verify",
                           str(workspace)], env=env, capture_output=True, text=True)
    assert done.returncode == 2 and "verify and profile tools start it again" in done.stderr


@pytest.mark.slow
def test_a_shell_starts_the_workspaces_server_and_finds_it_again(workspace: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != ENV}
    argv = [sys.executable, "-m", "cuda_agent", "workspace", "verify", str(workspace)]
    runs = [subprocess.run(argv, env=env, capture_output=True, text=True) for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), runs[-1].stderr
    server = WarmJudge(workspace).ping()
    try:
        assert server is not None and server["judged"] == 2
        with pytest.raises(WarmJudgeError, match="not running"):
            WarmJudge(workspace / "kernels").call("verify")  # a client that may not start one
    finally:
        os.kill(server["pid"], signal.SIGTERM)
    assert _gone(server["pid"])


def test_the_server_ends_when_its_owner_dies(workspace: Path) -> None:
    code = ("import sys, os; from cuda_agent.execution.warm_judge import WarmJudge, "
            "episode_configs; j = WarmJudge(sys.argv[1], episode_configs('cpu'), owner=True);"
            " j.start(); print(j.ping()['pid'], flush=True); os._exit(0)")
    done = subprocess.run([sys.executable, "-c", code, str(workspace)], capture_output=True,
                          text=True, check=True)
    assert _gone(int(done.stdout.split()[-1]))


def test_the_profile_s_baselines_are_measured_ahead_beside_a_verify(
        workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``measure_ahead`` the server measures the profile call's baselines as it starts:
    a verify runs meanwhile, no exclusive hold of the GPU's turn (the baselines' timed
    phases) overlaps a hold of another judge's, and the first profile uses those baselines
    instead of measuring its own."""
    from cuda_agent.execution.warm_judge import WarmJudgeConfig
    from cuda_agent.judge.gpu_turn import LOG_ENV

    log = tmp_path / "turns.jsonl"
    monkeypatch.setenv(LOG_ENV, str(log))
    judge = WarmJudge(workspace, episode_configs("cpu", QUICK), owner=True,
                      config=WarmJudgeConfig(measure_ahead="on"))
    try:
        judge.start(wait=True)
        verify = judge.call("verify")
        for _ in range(3000):
            state = judge.ping() or {}
            if state.get("baselines_ahead") != "measuring":
                break
            time.sleep(0.1)
        assert state["baselines_ahead"] == "done", state
        profile = judge.call("profile")
    finally:
        judge.close()
    assert verify.correct and profile.correct, (verify.reasons, profile.reasons)
    # measured ahead, not again: the judge's own kept figures (a steady fresh check faster
    # than them replaces eager's for this call, and says so)
    assert [b.source for b in profile.baselines] == ["judge"], profile.baselines
    assert profile.eager_timing.median_ms == state["eager_ms"] or any(
        "fresh check" in flag for flag in profile.flags), profile.flags
    spans: dict[str, list[dict]] = {}
    for line in log.read_text().splitlines():
        span = json.loads(line)
        spans.setdefault(span["turn"], []).append(span)
    assert len(spans) >= 2, spans.keys()  # the measurement's and the calls' judges
    for name, own in spans.items():
        others = [s for other, theirs in spans.items() if other != name for s in theirs
                  if s["kind"] != "timing"]
        for mine in (s for s in own if s["kind"] == "exclusive"):
            for theirs in others:
                assert mine["end"] <= theirs["start"] or theirs["end"] <= mine["start"], \
                    (mine, theirs)
