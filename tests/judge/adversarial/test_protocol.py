"""Invariants 1 and 3 under attack: candidates that reach the judge's code in their own
process (through computed names, which no static check can follow) and use the call
protocol against it: learn which calls are kept before computing, do their work before the
judge's ``go``, describe their pack falsely, write garbage to the call socket, or map code
the judge cannot read. Each must fail, or gain nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.judge.adversarial.helpers import (
    QUICK,
    judge,
    rejected,
    said,
    scale_add_model,
    write_scale_add,
    write_task,
)

# the harness's frame, reached from a raised exception without naming it
HARNESS = '''
import json
import os
import socket


def _harness(*wanted):
    try:
        raise RuntimeError
    except RuntimeError as exc:
        frame = getattr(getattr(exc, "__trace" + "back__"), "tb_" + "frame")
    while frame is not None:
        local = getattr(frame, "f_" + "locals")
        if all(name in local for name in wanted):
            return local
        frame = getattr(frame, "f_" + "back")
    raise RuntimeError("no harness frame")
'''

# says done on the call socket before computing; computes only calls the judge keeps
ORACLE = HARNESS + '''
_local = _harness("channel", "source")
_sock = socket.socket(fileno=os.dup(int(os.environ["CUDA_AGENT_CALLS_FD"])))
_early = []
_done = _local["channel"].done


def _patched_done(*args, **kwargs):
    return _early.pop() if _early else _done(*args, **kwargs)


_local["channel"].done = _patched_done


def kept_ahead():
    _sock.sendall(b'{"t":"done"}\\n')
    line = b""
    while not line.endswith(b"\\n"):
        byte = _sock.recv(1)
        if not byte:  # the judge hung up: nothing more to learn
            raise ConnectionError("the judge closed the call socket")
        line += byte
    _early.append(json.loads(line)["t"] == "keep")
    return _early[-1]
'''
ORACLE_FORWARD = '''
if kept_ahead():
    return cuda_extension.scale_add(x, y, self.alpha)
return cuda_extension.scale_add(x, y, 0.0)
'''

# the work of every counted call done while its inputs are made, before the judge's go
PREPARED = HARNESS + '''
_local = _harness("source", "job")
_fill = _local["source"].fill
_ready = {}


def _early_fill():
    inputs = _fill()
    _ready[id(inputs[0])] = cuda_extension.scale_add(inputs[0], inputs[1], 1.5)
    return inputs


_local["source"].fill = _early_fill
'''
PREPARED_FORWARD = '''
out = _ready.pop(id(x), None)
if out is None:
    return cuda_extension.scale_add(x, y, self.alpha)
return cuda_extension.identity(out)
'''

# one more input descriptor, far past the one call the pack is sized for
BLOATED = HARNESS + '''
_local = _harness("channel", "source")
_done = _local["channel"].done


def _bloated(pack=None, outputs=None, inputs=None):
    extra = {"offset": 256 << 20, "nbytes": 4, "dtype": "float32", "shape": [1]}
    return _done(pack, outputs, [*(inputs or []), extra])


_local["channel"].done = _bloated
'''

# garbage where the judge expects a message
GARBAGE = '''
import os

os.write(int(os.environ["CUDA_AGENT_CALLS_FD"]), b"\\xff" * 70000 + b"\\n")
'''

# a file that starts like an ELF shared object, mapped as code (mmap reached indirectly)
NOT_ELF = '''
import os
import struct
import multiprocessing.heap

_mm = getattr(multiprocessing.heap, "mm" + "ap")
_head = b"\\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8) + struct.pack("<H", 3) + b"\\x3e\\x00"
with open("/tmp/libnot_elf.so", "wb") as _handle:
    _handle.write(_head + b"\\xff" * 4078)
_fd = os.open("/tmp/libnot_elf.so", os.O_RDONLY)
_mapped = _mm.mmap(_fd, 4096, flags=_mm.MAP_SHARED, prot=_mm.PROT_READ | _mm.PROT_EXEC)
'''

# the harness's timing loop replaced: every call asked for as an untimed ``check`` call
# (which the judge's clock does not count), with the samples made up
CHECK_ONLY = '''
def _harness_globals():
    try:
        raise RuntimeError
    except RuntimeError as exc:
        frame = getattr(getattr(exc, "__trace" + "back__"), "tb_" + "frame")
    while frame is not None:
        found = getattr(frame, "f_" + "globals")
        if "timing" in found and "seccomp" in found:
            return found
        frame = getattr(frame, "f_" + "back")
    raise RuntimeError("no harness")


_timing = _harness_globals()["timing"]


def _check_only(fn, source, device, **kw):
    if kw.get("warmed"):
        kw["warmed"]()
    _timing.wall_calls(fn, source, device, "check", before=kw.get("before"),
                       watch=kw.get("watch"))
    return _timing.Measured([0.001] * 10, "wall", {})


setattr(_timing, "meas" + "ure", _check_only)
'''

HONEST = "return cuda_extension.scale_add(x, y, self.alpha)"


def _candidate(folder: Path, forward: str, header: str) -> Path:
    return write_scale_add(folder, scale_add_model(forward, header), "tools")


def test_learning_which_calls_are_kept_before_computing_fails(tmp_path: Path):
    """The outputs are committed with ``done``: a candidate that says ``done`` itself to
    learn the answer has packed nothing, and every call it computes is wrong but those it
    learns are kept: any kept call read before it answered finds no outputs, and the judge
    hangs up on it."""
    result = judge(write_task(tmp_path, "scale_add"),
                   _candidate(tmp_path / "oracle", ORACLE_FORWARD, ORACLE))
    assert rejected(result, "call protocol"), said(result)


def test_a_candidate_that_spins_after_the_judge_hangs_up_is_ended_then(tmp_path: Path):
    """The judge ends a worker as soon as it breaks the protocol: one that spins on after
    the judge hung up does not hold the judgement until its process timeout."""
    spinning = ORACLE.replace('raise ConnectionError("the judge closed the call socket")',
                              "while True: pass")
    assert spinning != ORACLE
    result = judge(write_task(tmp_path, "scale_add"),
                   _candidate(tmp_path / "spinner", ORACLE_FORWARD, spinning))
    assert rejected(result, "call protocol"), said(result)
    assert "timed out" not in said(result), said(result)


@pytest.mark.serial
def test_work_done_before_the_judges_go_is_charged_to_its_call(tmp_path: Path):
    """A candidate that computes each call's answer while its inputs are made (before
    ``ready``) and returns it at once: the judge charges that preparation to the call."""
    # eager's time plays no part here (the candidate's against the honest kernel's): cached
    config = QUICK.model_copy(update={"time_budget_s": 1.0, "min_runs": 10})
    task = write_task(tmp_path, "scale_add_big")
    honest = judge(task, write_scale_add(tmp_path / "honest"), config)
    result = judge(task, _candidate(tmp_path / "early", PREPARED_FORWARD, PREPARED), config)
    assert honest.correct and honest.runtime_ms, said(honest)
    assert result.reward == -1 or result.runtime_ms >= 0.5 * honest.runtime_ms, (
        result.runtime_ms, honest.runtime_ms, said(result))


def test_a_pack_described_past_one_call_is_refused_unread(tmp_path: Path):
    result = judge(write_task(tmp_path, "scale_add"),
                   _candidate(tmp_path / "bloated", HONEST, BLOATED))
    assert rejected(result, "at most"), said(result)


def test_garbage_on_the_call_socket_fails_only_the_candidate(tmp_path: Path):
    task = write_task(tmp_path, "scale_add")
    result = judge(task, _candidate(tmp_path / "garbage", HONEST, GARBAGE))
    assert rejected(result, "longer than", "protocol"), said(result)
    assert judge(task, write_scale_add(tmp_path / "honest")).correct  # the judge is fine


def test_code_the_judge_cannot_read_is_a_verdict_not_a_crash(tmp_path: Path):
    result = judge(write_task(tmp_path, "scale_add"),
                   _candidate(tmp_path / "not_elf", HONEST, NOT_ELF))
    assert rejected(result, "cannot check"), said(result)


def test_a_timed_jobs_calls_cannot_escape_the_judges_clock(tmp_path: Path):
    """Calls asked for in the untimed ``check`` phase of a timed job are refused: the
    judge's clock would count none of them, and the made-up samples would stand."""
    result = judge(write_task(tmp_path, "scale_add"),
                   _candidate(tmp_path / "check_only", HONEST, CHECK_ONLY))
    assert rejected(result, "phase 'check'"), said(result)
