"""The native-thread watch (``judge.threads``) on this machine's own threads."""

from __future__ import annotations

import threading

from cuda_agent.judge.threads import ThreadWatch


def test_a_thread_started_after_settling_is_named_until_it_ends():
    watch = ThreadWatch.settle("cpu")
    assert watch.problem("now") is None
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait, name="late-worker")
    worker.start()
    try:
        problem = watch.problem("after the call")
        assert problem is not None
        assert "1 native thread(s) still running after the call (late-worker)" in problem
    finally:
        stop.set()
        worker.join()
    assert watch.problem("now") is None
