"""A single-file candidate's ``load_inline`` is built by the judge through its cache
(``judge.inline_serve``): judged twice, it compiles once, and the second judgement compiles
nothing; an edited source compiles again; the candidate's process gets the module from a
cache it cannot write; what it writes on its build socket cannot hurt the judge. Real
judgements and compiles (torch's extension headers: tens of seconds a compile)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from cuda_agent.build import BuildConfig, Builder
from cuda_agent.judge import Candidate, Judge, JudgeConfig
from cuda_agent.judge.inline_load import Client, ProtocolError, pair, receive, send
from cuda_agent.judge.inline_serve import MAX_REQUESTS, InlineBuilds
from cuda_agent.tasks import load_task
from tests.conftest import INLINE_SCALE_ADD

CHECK_ONLY = JudgeConfig(device="cpu", time=False, trials=3)


def candidate(folder: Path, tag: str) -> Path:
    """The shared inline scale-add candidate, its C++ made new by ``tag``."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"cand_{tag}.py"
    path.write_text(INLINE_SCALE_ADD.replace("return out;", f"return out;  // {tag}"))
    return path


def judged(task: Path, path: Path):
    return Judge(CHECK_ONLY).judge(load_task(task), Candidate.from_ref(path))


@pytest.mark.slow
def test_judged_twice_it_builds_once_and_an_edit_builds_again(tmp_path: Path,
                                                               scale_add_task: Path):
    tag = uuid.uuid4().hex[:12]
    first = judged(scale_add_task, candidate(tmp_path, tag))
    assert first.correct and first.reward == 1, first.reasons
    assert first.build is not None and first.build.ok
    assert first.build.compiled == ("main.cpp",) and first.build.cached == ()
    module = Path(first.build.extension_path)
    assert module.name == "inline_scale_add.so" and module.is_file()
    again = judged(scale_add_task, candidate(tmp_path / "again", tag))  # same source
    assert again.correct and again.build is not None
    assert again.build.compiled == () and again.build.cached == ("main.cpp",)
    assert again.build.extension_path == str(module)
    assert dict(again.phases)["candidate.load"] < dict(first.phases)["candidate.load"]
    edited = judged(scale_add_task, candidate(tmp_path, tag + "x"))
    assert edited.correct and edited.build.compiled == ("main.cpp",)
    assert edited.build.extension_path != str(module)


def test_a_refused_flag_fails_the_candidate_before_any_compile(tmp_path: Path,
                                                              scale_add_task: Path):
    path = tmp_path / "cand.py"
    path.write_text(INLINE_SCALE_ADD.replace(
        'functions=["scale_add"])', 'functions=["scale_add"], '
        'extra_cflags=["-O3", "-fplugin=/tmp/evil.so"])'))
    result = judged(scale_add_task, path)
    assert result.reward == -1 and not result.compiled
    assert "'-fplugin=/tmp/evil.so' is not a flag the judge compiles with" in \
        " ".join(result.reasons), result.reasons
    assert result.build is not None and result.build.compiled == ()
    assert "extra_cflags" in str(result.build.errors[0])


def test_the_candidates_process_cannot_write_the_build_cache(tmp_path: Path,
                                                             scale_add_task: Path):
    """Confined, the candidate's process sees the judge's cache read-only: whatever it
    writes there fails (here the module folder that ``load_inline`` would load from)."""
    from cuda_agent.execution.sandbox_local import namespaces_work

    if not namespaces_work():
        pytest.skip("no namespaces here: the candidate's process is not confined")
    path = tmp_path / "cand.py"
    path.write_text('''
import os
from pathlib import Path

import torch.nn as nn


class ModelNew(nn.Module):
    pass


cache = Path(os.environ["CUDA_AGENT_HOME"]) / "build" / "inline"
try:
    cache.mkdir(parents=True, exist_ok=True)
    (cache / "planted.so").write_bytes(b"not a module")
except OSError as exc:
    raise RuntimeError(f"the cache is not writable here: {exc.strerror}") from None
raise RuntimeError("the cache was written")
''')
    result = judged(scale_add_task, path)
    assert "the cache is not writable here: read-only file system" in \
        " ".join(result.reasons).lower(), result.reasons


def test_what_a_process_writes_on_its_build_socket_cannot_hurt_the_judge(tmp_path: Path):
    builds = InlineBuilds(Builder(BuildConfig(cache_dir=tmp_path / "cache")))
    for junk in (b"\xff" * 8, (12).to_bytes(8, "little") + b"not json at", b""):
        judge_end, worker_end = pair()
        worker = type("W", (), {"inline_sock": judge_end})()
        builds.serve(worker)
        worker_end.sendall(junk)
        worker_end.close()  # the server's thread ends; nothing was built
    judge_end, worker_end = pair()
    builds.serve(type("W", (), {"inline_sock": judge_end})())
    client = Client(worker_end.detach())
    with pytest.raises(RuntimeError, match="name: a Python identifier"):
        client.build({"name": "bad name", "units": []})
    for _ in range(MAX_REQUESTS - 1):
        send(client.sock, {"t": "build"})
        assert receive(client.sock)["t"] == "refused"
    with pytest.raises(RuntimeError, match=f"at most {MAX_REQUESTS} builds"):
        client.build({"name": "ext", "units": [{"file": "main.cpp", "text": ""}]})
    with pytest.raises(ProtocolError, match="closed the build socket|socket failed"):
        client.build({"name": "ext", "units": [{"file": "main.cpp", "text": ""}]})
    assert builds.result() is not None and not builds.result().ok
    assert builds.result().compiled == () and not (tmp_path / "cache" / "objects").exists()
