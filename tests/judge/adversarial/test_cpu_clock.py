"""The judge's CPU clock: every thread's CPU time in a worker's process, read from outside
it, and charged to the timed calls wherever in a call's cycle it was spent
(``cpu_clock``, ``clock.judge_clock``)."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import cuda_agent
from cuda_agent.judge import calls
from cuda_agent.judge.calls import Lines
from cuda_agent.judge.clock import JudgeClock, judge_clock
from cuda_agent.judge.cpu_clock import CpuMark, open_process, thread_budget
from cuda_agent.judge.driver import CallDriver, DriverPlan, Record
from tests.judge.adversarial.helpers import (
    QUICK,
    judge,
    said,
    scale_add_model,
    write_scale_add,
    write_task,
)

# A child that, once told, spends CPU on a thread that then exits, says so, and waits.
BURNER = textwrap.dedent('''
    import sys, threading, time

    def burn(seconds):
        until = time.thread_time() + seconds
        while time.thread_time() < until:
            pass

    sys.stdin.readline()
    thread = threading.Thread(target=burn, args=(0.3,))
    thread.start()
    thread.join()
    print("burnt", flush=True)
    sys.stdin.read()
''')


def test_a_process_cpu_time_counts_its_exited_threads_apart_from_the_main_thread():
    child = subprocess.Popen([sys.executable, "-c", BURNER], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    cpu = open_process(child.pid)
    try:
        assert cpu is not None
        before = cpu.read()
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "burnt"
        after = cpu.read()
        others = (after.process_ns - after.main_ns) - (before.process_ns - before.main_ns)
        assert others >= 250_000_000, (before, after)  # the thread's 0.3 s, gone from /proc
        assert after.main_ns - before.main_ns < 250_000_000
    finally:
        child.kill()
        child.wait()
        if cpu is not None:
            cpu.close()
    assert open_process(child.pid) is None  # gone: nothing to read


def test_the_thread_budget_is_the_cpus_or_fewer_where_openmp_is_given_fewer():
    cpus = len(os.sched_getaffinity(0))
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    for omp, budget in ((None, cpus), ("1", 1), (str(cpus + 8), cpus), ("x", cpus)):
        child = subprocess.Popen(
            [sys.executable, "-c", "import sys; print('up', flush=True); sys.stdin.read()"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env=env if omp is None else {**env, "OMP_NUM_THREADS": omp})
        try:  # read once it runs: until its exec, /proc shows the parent's environment
            assert child.stdout.readline().strip() == "up"
            assert thread_budget(child.pid) == budget, omp
        finally:
            child.kill()
            child.wait()


def _record(phase: str, index: int, call_ms: float, cpu_ms: dict[str, float],
            threads: int = 1) -> Record:
    """A wall call of ``call_ms`` whose cycle takes ``cpu_ms`` of CPU time (keys ``main_pre``,
    ``main_win``, ``main_post`` for the main thread's before go, in the window and after
    done; ``others_...`` likewise for the other threads)."""
    record = Record(index, phase, 1, 1.0, True, sent=0.0, ready=0.001, go=0.001,
                    done=0.001 + call_ms / 1e3, threads=threads)
    main = sum(ms for key, ms in cpu_ms.items() if key.startswith("main_"))
    others = sum(ms for key, ms in cpu_ms.items() if key.startswith("others_"))
    record.cpu_sent = CpuMark(0, 0)
    record.cpu_next = CpuMark(int((main + others) * 1e6), int(main * 1e6))
    return record


HARNESS = {"main_pre": 4.0, "main_win": 0.2, "main_post": 1.0}
"""What a stand-in's cycle costs in CPU: the inputs made, the packing, the poisoning."""


def _clock(counted: dict[str, float], call_ms: float, threads: int = 1):
    stand_ins = [_record("calibrate", i, 0.2, HARNESS, threads) for i in range(9)]
    timed = [_record("timed", 9 + i, call_ms, counted, threads) for i in range(20)]
    return judge_clock(stand_ins + timed)


def test_a_thread_working_outside_the_window_is_charged_its_cpu_time():
    """Work on another thread before go, beside the window's own steps, or after done is
    the call's, over the thread budget; the wall clock alone saw none of it."""
    for where in ("others_pre", "others_win", "others_post"):
        clock = _clock({**HARNESS, where: 3.0}, call_ms=0.2)
        assert clock.median_ms == pytest.approx(3.0), where
        assert clock.cpu_bound == 20
        assert _clock({**HARNESS, where: 3.0}, 0.2, threads=2).median_ms == pytest.approx(1.5)


def test_the_main_threads_own_steps_and_an_honest_call_keep_their_wall_time():
    """The main thread runs one thing at a time: what it does between go and done is in
    the wall time, before ready in ``early``, and after done it can no longer reach the
    call's outputs. A call whose work runs inside the window on the threads the budget
    allows keeps its wall time."""
    assert _clock({**HARNESS, "main_pre": 6.0, "main_win": 3.0, "main_post": 3.0},
                  0.2).median_ms == pytest.approx(0.0)
    honest = _clock({**HARNESS, "main_win": 2.1, "others_win": 2.0}, 2.2, threads=2)
    assert honest.median_ms == pytest.approx(2.0) and honest.cpu_bound == 0


def test_without_the_stand_ins_cpu_time_the_wall_clock_alone_times():
    """Where the kernel lets the judge read no CPU clock, the stand-ins have no marks; a
    counted call without its marks (its process gone) is charged its wall time alone."""
    stand_ins = [_record("calibrate", i, 0.2, HARNESS) for i in range(9)]
    timed = [_record("timed", 9 + i, 0.7, {**HARNESS, "others_pre": 5.0}) for i in range(5)]
    timed[0].cpu_next = None
    assert judge_clock(stand_ins + timed).median_ms == pytest.approx(5.0)
    for record in stand_ins:
        record.cpu_sent = None
    clock = judge_clock(stand_ins + timed)
    assert clock.cpu_ref_ms is None and clock.median_ms == pytest.approx(0.5)


# A worker process of the call protocol whose main thread's own steps are the same in every
# call (a sleep, before ready and after done), and where, from the warm-up on, a thread of
# its own spins SPIN_MS of CPU beside one of them: before the judge's go, or after done. The
# wall clock sees neither: the window is empty and the steps take as long as the stand-ins'.
PROTOCOL_WORKER = textwrap.dedent('''
    import hashlib, sys, threading, time
    from cuda_agent.judge.calls import CallChannel

    where, spin_s, step_s = sys.argv[1], float(sys.argv[2]) / 1e3, float(sys.argv[3]) / 1e3
    block = bytes(1 << 18)

    def burn():  # hashing a large block lets go of the interpreter's lock: no wait for it
        until = time.thread_time() + spin_s
        while time.thread_time() < until:
            hashlib.sha256(block)

    def step(hidden):
        if hidden:
            threading.Thread(target=burn).start()
        time.sleep(step_s)

    channel = CallChannel()
    for phase in ("calibrate", "warmup", "timed", "tail"):
        while channel.need(phase, stop=True) is not None:
            step(phase != "calibrate" and where == "before-go")
            channel.ready()
            channel.done()
            step(phase != "calibrate" and where == "after-done")
''')
SPIN_MS = 20.0
STEP_MS = 100.0


def _protocol_run(where: str) -> JudgeClock:
    """The judge's clock of ``PROTOCOL_WORKER``'s calls, driven by the judge's driver."""
    judge_end, worker_end = calls.pair()
    env = {**os.environ, calls.ENV_FD: str(worker_end.fileno()), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(Path(cuda_agent.__file__).parents[1])}
    worker = subprocess.Popen([sys.executable, "-c", PROTOCOL_WORKER, where, str(SPIN_MS),
                               str(STEP_MS)], pass_fds=[worker_end.fileno()], env=env)
    worker_end.close()
    plan = DriverPlan(calibrate=5, warmup=1, min_runs=6, rng=random.Random(3))
    driver = CallDriver(Lines(judge_end), plan, None, pid_of=lambda: worker.pid).start()
    try:
        assert worker.wait(120) == 0
    finally:
        worker.kill()
    driver.join(60)
    assert driver.error is None and driver.finished
    return judge_clock(driver.records)


@pytest.mark.parametrize("where", ["before-go", "after-done"])
def test_the_cpu_a_thread_spends_beside_the_workers_own_steps_is_charged(where: str):
    clock = _protocol_run(where)
    assert clock.threads == 1 and clock.cpu_bound >= 6
    assert clock.median_ms >= 0.8 * SPIN_MS, clock


def test_a_worker_whose_threads_only_wait_is_not_charged():
    clock = _protocol_run("nowhere")
    assert clock.median_ms < 0.25 * SPIN_MS, clock


# A candidate that hides its native threads from the process's own thread watch (patched out
# through the garbage collector's list of objects) and has a native thread spin SPIN_MS of
# CPU per call where no wall clock of the judge's sees it: released once the call has
# returned, or while the harness makes the next call's inputs (from a patched
# ``torch.randn``, through the extension's entry taken before the judge wraps it), before
# the judge's go. The judge's CPU clock charges the spin all the same.
UNWATCHED = '''
import sys

_gc = getattr(sys, "mod" + "ules")["gc"]
for _watch in _gc.get_objects():
    if type(_watch).__name__ == "ThreadWatch":
        _watch.problem = lambda when: None
        _watch.before_call = lambda: None
'''
WHERE = {
    "released-after-the-call": (UNWATCHED, f"""
        out = cuda_extension.scale_add(x, y, self.alpha)
        return cuda_extension.burn_after(out, 1.0, {SPIN_MS})
        """),
    "released-before-go": (UNWATCHED + textwrap.dedent(f"""
        _burn = cuda_extension.burn_after
        _draw = getattr(torch, "ran" + "dn")
        _drawn = [0]


        def _drawing(*args, **kwargs):
            t = _draw(*args, **kwargs)
            _drawn[0] += 1
            if _drawn[0] % 2 == 1:  # the task draws x, then y: the first of each call
                _burn(t, 0.0, {SPIN_MS})
            return t


        setattr(torch, "ran" + "dn", _drawing)
        """), "return cuda_extension.scale_add(x, y, self.alpha)"),
}


@pytest.mark.slow
@pytest.mark.serial
@pytest.mark.parametrize("where", list(WHERE))
def test_the_cpu_a_hidden_thread_spends_outside_the_window_is_charged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # a budget of one thread
    header, forward = WHERE[where]
    candidate = write_scale_add(tmp_path / "ws", scale_add_model(forward, header),
                                "burn_after")
    result = judge(write_task(tmp_path, "scale_add"), candidate,
                   QUICK.model_copy(update={"cache_baselines": False}))
    assert result.correct, said(result)  # the watch is patched out: nothing refuses it
    assert result.timing.clock_ms >= 0.5 * SPIN_MS, said(result)
