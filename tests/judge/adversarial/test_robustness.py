"""A hostile candidate never takes the judge down, and reaches no other library's
arithmetic: its worker folder's files replaced by a pipe or a link to an endless device,
its own report forged, its compile cache filled with links and holes, a tensor's data
handed to another library, a library loaded inside a call."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from cuda_agent.execution.sandbox_local import namespaces_work
from tests.judge.adversarial.helpers import (
    judge,
    rejected,
    said,
    scale_add_model,
    write_scale_add,
    write_task,
)

needs_namespaces = pytest.mark.skipif(not namespaces_work(),
                                      reason="the worker's own folder: a confined worker")
HONEST = "return cuda_extension.scale_add(x, y, self.alpha)"

# model_new.py is copied to <worker folder>/candidate/: its stderr.log is next door
FOLDER = '''
import os
from pathlib import Path

_folder = Path(__file__).resolve().parent.parent
_log = _folder / "stderr.log"
'''
FIFO = FOLDER + '''
if _log.exists():
    _log.unlink()
    os.mkfifo(_log)
'''
ENDLESS = FOLDER + '''
if _log.exists():
    _log.unlink()
    os.symlink("/dev/zero", _log)
_report = _folder / "result.json"
'''
# the worker's own report reached through the frames of the code that called forward
FORGED = '''
import sys
import threading

_forged = []


def _forge():
    frame = getattr(sys, "_current_" + "frames")()[threading.get_ident()]
    while frame is not None:
        report = getattr(frame, "f_" + "locals").get("result")
        if isinstance(report, dict) and "stage_at" in report:
            report["stage_at"]["~"] = "not a time"
            report["samples_ms"] = ["fast"]
            _forged.append(1)
            return
        frame = getattr(frame, "f_" + "back")
'''
FORGED_FORWARD = '''
if not _forged:
    _forge()
return cuda_extension.scale_add(x, y, self.alpha)
'''
# NumPy's arithmetic on the tensors' memory, reached through DLPack
DLPACK = '''
import numpy as np
'''
DLPACK_FORWARD = '''
out = cuda_extension.empty_f32(x)
o = np.from_dlpack(out)
np.multiply(np.from_dlpack(x), np.float32(self.alpha), out=o)
np.add(o, np.from_dlpack(y), out=o)
return out
'''
# a system library no one loaded, opened and closed again inside every call
LOADS = '''
import sys

_dl = getattr(sys, "mod" + "ules")["_c" + "types"]
_maps = open("/proc/self/maps").read()
_lib = next(p for p in ("/usr/lib/x86_64-linux-gnu/libexpat.so.1",
                        "/lib/x86_64-linux-gnu/libexpat.so.1") if "expat" not in _maps)
'''
LOADS_FORWARD = '''
handle = _dl.dlopen(_lib, 2)
_dl.dlclose(handle)
return cuda_extension.scale_add(x, y, self.alpha)
'''


def _candidate(folder: Path, forward: str, header: str) -> Path:
    return write_scale_add(folder, scale_add_model(forward, header), "tools")


@needs_namespaces
@pytest.mark.timeout(900)
@pytest.mark.parametrize("header", [FIFO, ENDLESS], ids=["fifo", "endless-device"])
def test_files_of_the_worker_folder_cannot_stall_the_judge(tmp_path: Path, header: str):
    """The judge reads the worker's stderr through its own descriptor and the worker's
    report only as a regular file of bounded size."""
    result = judge(write_task(tmp_path, "scale_add"), _candidate(tmp_path / "c", HONEST,
                                                                 header))
    assert result.reward >= -1 and result.correct, said(result)


def test_a_forged_report_is_cut_to_what_the_judge_reads(tmp_path: Path):
    result = judge(write_task(tmp_path, "scale_add"),
                   _candidate(tmp_path / "c", FORGED_FORWARD, FORGED))
    assert result.correct, said(result)  # the forged fields dropped: samples kept honest
    assert result.timing is not None and result.timing.median_ms > 0


def test_a_tensors_data_cannot_reach_another_librarys_arithmetic(tmp_path: Path):
    result = judge(write_task(tmp_path, "scale_add"),
                   _candidate(tmp_path / "c", DLPACK_FORWARD, DLPACK))
    assert rejected(result, "not allowed inside ModelNew.forward", "__dlpack__"), said(result)


def test_no_new_native_code_once_the_calls_have_begun(tmp_path: Path):
    """A library mapped inside each call and unmapped before it returns is never there when
    the judge checks what the process loaded; once the warm-up is over no new code maps."""
    if not any(Path(p).exists() for p in ("/usr/lib/x86_64-linux-gnu/libexpat.so.1",
                                          "/lib/x86_64-linux-gnu/libexpat.so.1")):
        pytest.skip("no libexpat on this machine to load")
    result = judge(write_task(tmp_path, "scale_add"),
                   _candidate(tmp_path / "c", LOADS_FORWARD, LOADS))
    assert rejected(result, "failed to map", "operation not permitted"), said(result)


def test_a_compile_cache_of_links_or_holes_is_not_kept(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch):
    from cuda_agent.judge import confine

    monkeypatch.setenv("CUDA_AGENT_HOME", str(tmp_path / "home"))
    snapshot = tmp_path / "snapshot"
    snapshot.mkdir()

    def kept(name: str, make) -> bool:
        (snapshot / "model_new.py").write_text(f"# {name}\n")
        worker = SimpleNamespace(out_dir=tmp_path / name, confined=True)
        worker.out_dir.mkdir()
        make(worker.out_dir / "inline")
        confine.keep_inline_cache(worker, snapshot, "file")
        return confine._inline_cache(snapshot).exists()

    def plain(folder: Path) -> None:
        folder.mkdir()
        (folder / "module.so").write_bytes(b"\x7fELF" + bytes(60))

    def linked(folder: Path) -> None:
        os.symlink(Path(__file__).parent, folder)

    def holey(folder: Path) -> None:
        folder.mkdir()
        with open(folder / "big.so", "wb") as handle:
            handle.truncate(confine.INLINE_CACHE_BYTES + 1)

    def link_inside(folder: Path) -> None:
        plain(folder)
        os.symlink("/etc/passwd", folder / "passwd")

    assert kept("plain", plain)
    assert not kept("linked", linked)
    assert not kept("holey", holey)
    assert not kept("link_inside", link_inside)


def test_a_calls_inputs_tell_nothing_of_its_seed_during_the_call():
    import torch

    from cuda_agent.judge.harness import _made
    from cuda_agent.judge.worker import load_task_namespace
    from tests.conftest import SCALE_ADD_TASK

    ns = load_task_namespace(SCALE_ADD_TASK)
    _made(ns, 123456789, "cpu", 1.0)
    assert torch.initial_seed() != 123456789
