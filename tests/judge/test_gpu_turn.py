"""The GPU's turn across processes (``judge.gpu_turn``): shared holders overlap, an
exclusive holder excludes every other, a waiting exclusive holder is not starved by shared
holders that keep coming, a hold steps down and back up without a break, and a holder that
dies lets go; and the holds of a worker's phases (``judge.turn_phases``). Each holder is a
process of its own, driven line by line; every figure compared is a stamp of the
system-wide monotonic clock taken inside a holder: ``t`` once a command is done,
``before`` as it began (a release's stamp is taken before it lets go, so a holder that got
the turn only once another let go stamps its ``t`` after the other's ``before``)."""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

MODULE = Path(__file__).resolve().parents[2] / "src" / "cuda_agent" / "judge" / "gpu_turn.py"
HOLDER = f"""
import importlib.util, json, sys, time
spec = importlib.util.spec_from_file_location("gpu_turn", {str(MODULE)!r})
gpu_turn = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_turn)  # the module alone: no torch to import
turn = gpu_turn.GpuTurn(sys.argv[1])
print(json.dumps({{"ready": True}}), flush=True)
for line in sys.stdin:
    cmd = line.strip()
    ok, before = True, time.monotonic()
    if cmd == "try_shared":
        ok = turn.shared(wait=False)
    elif cmd == "try_exclusive":
        ok = turn.exclusive(wait=False)
    elif cmd == "upgradable":
        turn.exclusive(upgradable=True)
    else:
        getattr(turn, cmd)()
    print(json.dumps({{"cmd": cmd, "ok": ok, "before": before, "t": time.monotonic()}}),
          flush=True)
"""
PATIENCE_S = 120.0
"""How long a holder may take to answer a command it can carry out at once (a loaded
machine's scheduling delay, never a lock's wait)."""


class Holder:
    """A process holding (or not) the turn at ``lock``; ``send`` a command, ``answer`` it."""

    def __init__(self, lock: Path):
        self.proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(lock)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        assert self.answer()["ready"]

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(json.loads(line))

    def send(self, cmd: str) -> None:
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()

    def answer(self) -> dict:
        return self.lines.get(timeout=PATIENCE_S)

    def do(self, cmd: str) -> dict:
        self.send(cmd)
        return self.answer()

    def pending(self) -> bool:
        """Whether the last command is still unanswered (it waits for the turn)."""
        return self.lines.empty()

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def holders(tmp_path: Path):
    made: list[Holder] = []

    def make() -> Holder:
        made.append(Holder(tmp_path / "locks" / "gpu0.lock"))
        return made[-1]

    yield make
    for holder in made:
        holder.close()


def queued(probe: Holder) -> None:
    """Wait until a shared holder could not come in: an exclusive holder is waiting (or
    holds the turn). Each probe that got in lets go at once."""
    deadline = time.monotonic() + PATIENCE_S
    while probe.do("try_shared")["ok"]:
        probe.do("release")
        assert time.monotonic() < deadline, "no exclusive holder ever queued"
        time.sleep(0.01)


def test_shared_holders_overlap_and_an_exclusive_one_waits_for_them_all(holders):
    a, b, writer, probe = holders(), holders(), holders(), holders()
    a.do("shared")
    b.do("shared")  # answered while a holds it: shared holds overlap
    assert not probe.do("try_exclusive")["ok"]
    writer.send("exclusive")
    queued(probe)
    assert writer.pending()
    a_out = a.do("release")["before"]
    b_out = b.do("release")["before"]
    got = writer.answer()["t"]
    assert got > max(a_out, b_out)
    assert not probe.do("try_shared")["ok"] and not probe.do("try_exclusive")["ok"]
    out = writer.do("release")["before"]
    after = probe.do("try_shared")
    assert after["ok"] and after["t"] > out


def test_a_waiting_exclusive_holder_is_not_starved_by_shared_holders_that_keep_coming(
        holders):
    """Shared holders arrive one after another while the turn is held shared all along;
    once an exclusive holder waits, none of them gets in before it has had its turn."""
    first, writer, probe = holders(), holders(), holders()
    stream = [holders() for _ in range(3)]
    first.do("shared")
    writer.send("exclusive")
    queued(probe)
    for reader in stream:
        reader.send("shared")
    first_out = first.do("release")["before"]
    got = writer.answer()["t"]
    assert got > first_out
    assert all(reader.pending() for reader in stream)  # still waiting: the writer holds it
    out = writer.do("release")["before"]
    assert all(reader.answer()["t"] > out for reader in stream)


def test_a_hold_steps_down_and_back_up_with_no_exclusive_holder_in_between(holders):
    """An upgradable hold (a candidate's process between its stand-ins and its timed calls)
    shares the turn while it is down, and no other exclusive holder comes in before it has
    let go: another writer queues behind it even while it only holds it shared."""
    owner, reader, writer, probe = holders(), holders(), holders(), holders()
    owner.do("upgradable")
    assert not probe.do("try_shared")["ok"]
    owner.do("downgrade")
    reader.do("shared")  # answered: the owner's hold is shared now
    writer.send("exclusive")
    assert not probe.do("try_exclusive")["ok"]
    owner.send("upgrade")  # waits for the reader
    queued(probe)
    assert owner.pending()
    reader_out = reader.do("release")["before"]
    up = owner.answer()["t"]
    assert up > reader_out
    assert writer.pending()
    owner_out = owner.do("release")["before"]
    assert writer.answer()["t"] > owner_out


def test_a_holder_that_dies_lets_the_turn_go(holders):
    """The kernel drops a dead holder's locks: an exclusive holder's, and a waiting
    exclusive holder's place at the gate (shared holders come in again)."""
    dead, other = holders(), holders()
    dead.do("exclusive")
    dead.proc.send_signal(signal.SIGKILL)
    dead.proc.wait()
    assert other.do("exclusive")["ok"]
    other.do("release")
    reader, waiting, probe = holders(), holders(), holders()
    reader.do("shared")
    waiting.send("exclusive")
    queued(probe)
    waiting.proc.send_signal(signal.SIGKILL)
    waiting.proc.wait()
    assert probe.do("shared")["ok"]  # the reader still holds it: shared holders come in


def test_phase_turns_hold_the_measured_phases_exclusive(tmp_path: Path):
    """What a worker's phases need of the turn, as its driver meets them: a candidate's
    stand-ins and timed calls exclusive, its loading, warm-up and what follows its tail
    shared, and a worker that skips its warm-up still times alone; a trusted worker's
    first call shared, its timing exclusive to the job's end; nothing changes after
    ``stop``."""
    from cuda_agent.judge.gpu_turn import EXCLUSIVE, SHARED, GpuTurn
    from cuda_agent.judge.turn_phases import candidate_job, trusted_job

    turn = GpuTurn(tmp_path / "gpu0.lock")
    seen = []
    with candidate_job(turn, timed=True) as turns:
        seen.append(turn.level)  # the worker's set-up
        turns.before("calibrate")
        seen.append(turn.level)
        turns.ended("calibrate")
        seen.append(turn.level)  # the candidate's code loads
        turns.before("warmup")
        seen.append(turn.level)
        turns.ended("warmup")
        seen.append(turn.level)  # the device timer calibrates itself
        for phase in ("timed", "record", "tail"):
            turns.before(phase)
            seen.append(turn.level)
        turns.ended("tail")
        seen.append(turn.level)  # the profile, the process's exit
    assert seen == [EXCLUSIVE, EXCLUSIVE, SHARED, SHARED, EXCLUSIVE, EXCLUSIVE, EXCLUSIVE,
                    EXCLUSIVE, SHARED]
    assert turn.level is None and not turn.intent

    with candidate_job(turn, timed=True) as turns:
        turns.ended("calibrate")
        turns.before("timed")  # no warm-up asked for
        assert turn.level == EXCLUSIVE
        turns.stop()
        turns.ended("tail")
        assert turn.level == EXCLUSIVE

    with trusted_job(turn) as turns:
        assert turn.level == SHARED  # the first call (torch.compile's compilation)
        turns.before("calibrate")
        assert turn.level == EXCLUSIVE
        turns.ended("calibrate")
        turns.before("warmup")
        assert turn.level == SHARED
        turns.ended("warmup")
        turns.before("timed")
        turns.ended("tail")
        assert turn.level == EXCLUSIVE  # the memory bandwidth is measured after the tail
    with candidate_job(turn, timed=False) as turns:
        assert turns is None and turn.level == SHARED
    turn.close()


def test_staging_waits_until_the_worker_has_prepared(tmp_path: Path):
    """A worker says when it has done a ``prepare`` line (on CUDA its context and lent pack:
    GPU work that a judge sharing the GPU keeps inside its shared hold), and a worker that
    ends first is not waited for."""
    from cuda_agent.judge.runner import Worker

    worker = Worker(trace=False)
    try:
        assert worker.wait_idle(PATIENCE_S)
        assert worker.wait_prepared(0)  # nothing asked yet
        worker.prepare("cpu")
        assert worker.wait_prepared(PATIENCE_S)
        worker.kill()
        worker.proc.wait()
        worker.prepare("cpu")
        assert not worker.wait_prepared(PATIENCE_S)
    finally:
        worker.close()
