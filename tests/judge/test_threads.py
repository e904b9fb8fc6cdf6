"""The native-thread watch (``judge.threads``) on a fresh interpreter's own threads (the test
process itself is not quiet: Ray, servers and thread pools of other tests may start threads
in it at any time)."""

from __future__ import annotations

import subprocess
import sys

SCENARIO = """
import os
import threading
import time
from cuda_agent.judge.threads import ThreadWatch

watch = ThreadWatch.settle("cpu")
print("settled:", watch.problem("now"))
stop = threading.Event()
worker = threading.Thread(target=stop.wait, name="late-worker")
worker.start()
print("running:", watch.problem("after the call"))
watch.adopt()  # as after the activity record starts: what runs now is the judge's
print("adopted:", watch.problem("now"))
stop.set()
worker.join()
# join() returns before the kernel has removed the thread's task: wait until it has
deadline = time.monotonic() + 5
while os.path.exists(f"/proc/self/task/{worker.native_id}") and time.monotonic() < deadline:
    time.sleep(0.001)
print("ended:", watch.problem("now"))
"""


def test_a_thread_started_after_settling_is_named_until_it_ends():
    done = subprocess.run([sys.executable, "-c", SCENARIO], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = dict(line.split(": ", 1) for line in done.stdout.splitlines() if ": " in line)
    assert lines["settled"] == "None"
    assert "1 native thread(s) still running after the call (late-worker)" in lines["running"]
    assert lines["adopted"] == "None"
    assert lines["ended"] == "None"


def test_a_thread_counts_while_it_has_the_process_memory():
    """A live thread runs user code; a task that has gone (or, exiting after a C++ join, has
    dropped the process's memory) does not."""
    import threading

    from cuda_agent.judge.threads import runs_user_code

    stop = threading.Event()
    worker = threading.Thread(target=stop.wait)
    worker.start()
    try:
        assert runs_user_code(str(worker.native_id))
        assert runs_user_code(str(threading.get_native_id()))
    finally:
        stop.set()
        worker.join()
    assert not runs_user_code("999999999")
