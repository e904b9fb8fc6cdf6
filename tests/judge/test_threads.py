"""The native-thread watch (``judge.threads``) on fresh interpreters' own threads (the test
process itself is not quiet: Ray, servers and thread pools of other tests may start threads
in it at any time), with Python threads and native ones from a small compiled library.

No test waits on the wall clock: a thread's progress is waited for by its CPU time or a flag
it sets, and the watch's own settling is bounded by CPU time."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from cuda_agent.judge.threads import runs_user_code, snapshot, thread_name, worked

NATIVE = r'''
#include <pthread.h>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

namespace {
std::atomic<bool> stop{false}, done{false};
// never destroyed: a condition variable destroyed at exit with a waiter would wait for it
std::mutex& mu = *new std::mutex;
std::condition_variable& wake = *new std::condition_variable;
bool go = false;
volatile double sink = 0;

void crunch(int64_t n) {
  double total = 0;
  for (int64_t i = 0; i < n; ++i) total += static_cast<double>(i % 7) * 0.5;
  sink = total;
}
}  // namespace

extern "C" {
// an OpenMP team of `threads` doing a little work each
double team(int threads, int64_t n) {
  double total = 0;
#pragma omp parallel for num_threads(threads) reduction(+ : total)
  for (int64_t i = 0; i < n; ++i) total += static_cast<double>(i % 7) * 0.5;
  return total;
}

// a thread that computes until told to stop, as work left behind by a call would
void start_runner() {
  std::thread([] {
    pthread_setname_np(pthread_self(), "late-runner");
    while (!stop.load()) crunch(1 << 16);
  }).detach();
}

// a thread that sleeps until woken, computes, says so, and sleeps again
void start_sleeper() {
  std::thread([] {
    pthread_setname_np(pthread_self(), "late-sleeper");
    for (;;) {
      std::unique_lock<std::mutex> lock(mu);
      wake.wait(lock, [] { return go; });
      go = false;
      lock.unlock();
      crunch(int64_t{1} << 24);
      done.store(true);
    }
  }).detach();
}

void wake_sleeper() {
  {
    std::lock_guard<std::mutex> lock(mu);
    go = true;
  }
  wake.notify_one();
}

int sleeper_done() { return done.load() ? 1 : 0; }
void stop_runner() { stop.store(true); }
}
'''

PRELUDE = """
import ctypes, os, sys, threading
import torch
torch.set_num_threads(2)
from cuda_agent.judge.threads import ThreadWatch
watch = ThreadWatch.settle("cpu")
lib = ctypes.CDLL(sys.argv[1]) if len(sys.argv) > 1 else None
if lib is not None:
    lib.team.restype = ctypes.c_double
    lib.team.argtypes = [ctypes.c_int, ctypes.c_int64]
"""


def run_scenario(body: str, *args: str) -> dict[str, str]:
    """Run PRELUDE + ``body`` in a fresh interpreter; its ``name: value`` lines. It ends
    with ``os._exit``: native threads left running or waiting keep no destructor waiting."""
    code = PRELUDE + textwrap.dedent(body) + "\nsys.stdout.flush()\nos._exit(0)\n"
    done = subprocess.run([sys.executable, "-c", code, *args],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(line.split(": ", 1) for line in done.stdout.splitlines() if ": " in line)


@pytest.fixture(scope="module")
def native(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The helper library, built with g++ -fopenmp (its libgomp is the one torch loaded)."""
    folder = tmp_path_factory.mktemp("native_threads")
    (folder / "native.cpp").write_text(NATIVE)
    library = folder / "libnative.so"
    subprocess.run(["g++", "-O1", "-std=c++17", "-fopenmp", "-shared", "-fPIC",
                    str(folder / "native.cpp"), "-o", str(library), "-lpthread"],
                   check=True, capture_output=True, timeout=300)
    return str(library)


def test_parked_extra_openmp_threads_pass(native: str):
    """A team of 16 on a pool of 2 leaves 14 threads parked in libgomp's pool: alive, idle
    between calls, working again inside the next call. None of that is work after a call."""
    lines = run_scenario("""
        print("settled:", watch.problem("now"))
        for call in range(3):
            print(f"before {call}:", watch.before_call())
            lib.team(16, 2_000_000)
            print(f"after {call}:", watch.problem("after forward returned"))
        print("parked:", len(watch.started()))
        """, native)
    assert lines.pop("settled") == "None"
    assert int(lines.pop("parked")) >= 8, lines  # the extra threads are there, and idle
    assert set(lines.values()) == {"None"}, lines


def test_a_native_thread_that_computes_after_the_call_is_refused(native: str):
    lines = run_scenario("""
        watch.before_call()
        lib.start_runner()  # the call returns with a thread still computing
        print("after:", watch.problem("after forward returned"))
        lib.stop_runner()
        """, native)
    assert "1 native thread(s) that kept running after forward returned" in lines["after"]
    assert "(late-runner)" in lines["after"]


def test_a_native_thread_that_sleeps_then_computes_between_calls_is_refused(native: str):
    lines = run_scenario("""
        watch.before_call()
        lib.start_sleeper()  # started by a call, asleep when the call returns
        print("after:", watch.problem("after forward returned"))
        lib.wake_sleeper()  # ... and it works before the next call
        while not lib.sleeper_done():
            os.sched_yield()
        print("before next:", watch.before_call())
        """, native)
    assert lines["after"] == "None"
    assert "that worked between calls" in lines["before next"]
    assert "(late-sleeper)" in lines["before next"]


def test_python_threads_idle_pass_busy_are_named():
    lines = run_scenario("""
        print("settled:", watch.problem("now"))
        stop = threading.Event()
        idle = threading.Thread(target=stop.wait, name="idle-worker")
        idle.start()
        print("idle:", watch.problem("after the call"))
        print("listed:", watch.started())
        def spin():
            while not stop.is_set():
                pass
        busy = threading.Thread(target=spin, name="busy-worker")
        busy.start()
        print("busy:", watch.problem("after the call"))
        watch.adopt()  # as after the activity record starts: what runs now is the judge's
        print("adopted:", watch.problem("now"))
        stop.set()
        idle.join()
        busy.join()
        """)
    assert lines["settled"] == "None"
    assert lines["idle"] == "None" and "idle-worker" in lines["listed"]
    assert "that kept running after the call" in lines["busy"]
    assert "busy-worker" in lines["busy"] and "idle-worker" not in lines["busy"]
    assert lines["adopted"] == "None"


CHILD = """
import os, sys, threading
def name(text):
    with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as handle:
        handle.write(text)
stop, go = threading.Event(), threading.Event()
def busy():
    name("child-busy")
    go.wait()
    while not stop.is_set():
        sum(range(1000))
def idle():
    name("child-idle")
    stop.wait()
threads = [threading.Thread(target=busy), threading.Thread(target=idle)]
for t in threads:
    t.start()
print(" ".join(str(t.native_id) for t in threads), flush=True)
sys.stdin.readline()
go.set()
sys.stdin.read()
stop.set()
"""


def test_snapshots_of_another_process_name_the_thread_that_worked():
    """What the judge does from outside: two snapshots of the candidate's process by pid."""
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        busy, idle = child.stdout.readline().split()
        last, first = {}, snapshot(child.pid, [busy, idle])
        while last != first or any(task.state != "S" for task in first.values()):
            os.sched_yield()  # until both wait on their events: asleep, their CPU time still
            last, first = first, snapshot(child.pid, [busy, idle])
        child.stdin.write("go\n")
        child.stdin.flush()
        later = first
        while later[busy].cpu_ns - first[busy].cpu_ns < 2_000_000:  # 2 ms of its CPU
            os.sched_yield()
            later = snapshot(child.pid, [busy, idle])
        moved = worked(first, later)
        assert busy in moved and idle not in moved
        assert [thread_name(t, child.pid) for t in moved] == ["child-busy"]
        assert worked({}, {idle: first[idle]}, tolerance_ns=10**15) == []
    finally:
        child.communicate("", timeout=60)


def test_a_thread_counts_while_it_has_the_process_memory():
    """A live thread runs user code; a task that has gone (or, exiting after a C++ join, has
    dropped the process's memory) does not."""
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait)
    worker.start()
    try:
        assert runs_user_code(str(worker.native_id))
        assert runs_user_code(str(threading.get_native_id()))
        assert str(worker.native_id) in snapshot()
    finally:
        stop.set()
        worker.join()
    assert not runs_user_code("999999999")
    assert snapshot("self", ["999999999"]) == {}
    assert Path("/proc/self/task").is_dir()
