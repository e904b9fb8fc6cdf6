"""What the candidate's process loaded as code is checked over the whole run (invariant 4):
code unmapped, unlinked, replaced or rewritten once the calls are counted is still checked
(the judge holds the mapped files then, ``judge.code_hold``), and one file by many names,
many copies or one huge file cannot stall the check (``build.mapped``). Real libraries built
with g++, loaded by a real process; two real judgements.

    pytest -q -p no:cacheprovider tests/judge/adversarial/test_loaded_code.py
"""

from __future__ import annotations

import base64
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cuda_agent.build import mapped, symbol_rules, symbols
from cuda_agent.judge import code_hold
from cuda_agent.judge.guard import ALLOWED
from tests.judge.adversarial.helpers import (
    judge,
    rejected,
    said,
    scale_add_model,
    write_file_candidate,
    write_scale_add,
    write_task,
)

POLICY = symbols.single_file_policy(ALLOWED)
TRUSTED = [Path(p) for p in (sys.base_prefix, sys.prefix, "/usr", "/lib", "/lib64")]
REFUSED_SOURCE = '#include <dlfcn.h>\nextern "C" void* find(void* h) { return dlsym(h, "x"); }\n'
PLAIN_SOURCE = 'extern "C" float twice(float x) { return 2 * x; }\n'
SECCOMP = Path(__file__).resolve().parents[3] / "src/cuda_agent/judge/seccomp.py"
x86_64_linux = pytest.mark.skipif(
    platform.machine() != "x86_64" or platform.system() != "Linux",
    reason="the judge's seccomp filter is built for Linux x86-64")

# A process that loads, maps and unloads code when told, one command a line on stdin.
LOADER = r'''
import ctypes, importlib.util, mmap, os, sys
import _ctypes

spec = importlib.util.spec_from_file_location("seccomp", sys.argv[1])
seccomp = importlib.util.module_from_spec(spec)
spec.loader.exec_module(seccomp)
forbid_new_code = seccomp.prepare()
libc = ctypes.CDLL(None)
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
loaded, maps = {}, []
print("ok", flush=True)
for line in sys.stdin:
    verb, *args = line.split()
    if verb == "load":
        loaded[args[0]] = ctypes.CDLL(args[0])
    elif verb == "dlclose":
        _ctypes.dlclose(loaded.pop(args[0])._handle)
    elif verb == "map":
        for path in args:
            fd = os.open(path, os.O_RDONLY)
            maps.append(mmap.mmap(fd, 4096, flags=mmap.MAP_PRIVATE,
                                  prot=mmap.PROT_READ | mmap.PROT_EXEC))
            os.close(fd)
    elif verb == "munmap":
        for entry in open("/proc/self/maps").read().splitlines():
            fields = entry.split()
            if len(fields) >= 6 and fields[5] == args[0]:
                lo, hi = (int(v, 16) for v in fields[0].split("-"))
                libc.munmap(lo, hi - lo)
    elif verb == "mapw":  # shared and writable, one byte written (its pages then writable)
        fd = os.open(args[0], os.O_RDWR)
        maps.append(mmap.mmap(fd, 4096, flags=mmap.MAP_SHARED,
                              prot=mmap.PROT_READ | mmap.PROT_WRITE))
        os.close(fd)
        maps[-1][0] = maps[-1][0]
    elif verb == "mappen":  # shared, one byte written, then made read-only
        fd = os.open(args[0], os.O_RDWR)
        maps.append(mmap.mmap(fd, 4096, flags=mmap.MAP_SHARED,
                              prot=mmap.PROT_READ | mmap.PROT_WRITE))
        os.close(fd)
        maps[-1][0] = maps[-1][0]
        pen = ctypes.c_char.from_buffer(maps[-1])
        libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        assert libc.mprotect(ctypes.addressof(pen), 4096, mmap.PROT_READ) == 0
    elif verb == "maprwx":  # private, writable and executable at once
        fd = os.open(args[0], os.O_RDONLY)
        maps.append(mmap.mmap(fd, 4096, flags=mmap.MAP_PRIVATE,
                              prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC))
        os.close(fd)
    elif verb == "seccomp":
        assert forbid_new_code() is None
    print("ok", flush=True)
'''


class Loader:
    """The loading process: ``do`` sends one command and waits until it is done."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", LOADER, str(SECCOMP)], text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self._answer()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def do(self, *words: str | Path) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(" ".join(map(str, words)) + "\n")
        self.proc.stdin.flush()
        self._answer()

    def _answer(self) -> None:
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().strip() == "ok", "the loading process failed"

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def loader() -> Iterator[Loader]:
    process = Loader()
    yield process
    process.close()


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A shared object the single-file policy refuses (it calls dlsym) and a plain one."""
    folder = tmp_path_factory.mktemp("loaded-code-libraries")
    found = {}
    for name, text in {"refused": REFUSED_SOURCE, "plain": PLAIN_SOURCE}.items():
        source = folder / f"{name}.cpp"
        source.write_text(text)
        found[name] = folder / f"lib{name}.so"
        subprocess.run(["g++", "-shared", "-fPIC", str(source), "-o", str(found[name])],
                       check=True)
    return found


def _copy(built: dict[str, Path], name: str, to: Path) -> Path:
    to.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(built[name], to)
    return to


def _check(pid: int, held: code_hold.HeldCode | None = None) -> list[str]:
    return [str(p) for p in mapped.check_process(pid, POLICY, TRUSTED,
                                                 held=held.files if held else ())]


def _refused(where: str | Path) -> str:
    return f"{where} calls dlsym ({symbol_rules.LOOKUP}): not allowed"


def _map_files_open() -> bool:
    """Whether this process may open ``/proc/PID/map_files`` (else a deleted file mapped
    by another process is unreadable to the judge, and refused as such)."""
    span = next(line.split(maxsplit=1)[0] for line in
                Path("/proc/self/maps").read_text().splitlines() if "/" in line)  # a file's
    try:
        os.close(os.open(f"/proc/self/map_files/{span}", os.O_RDONLY))
    except OSError:
        return False
    return True


@x86_64_linux
@pytest.mark.parametrize("unload", ["dlclose", "munmap"])
def test_code_unmapped_after_the_hold_is_still_checked(tmp_path: Path, built, loader: Loader,
                                                       unload: str):
    """The red team's L1: a library used in every call and unmapped after the last one is
    not there at the end; the judge's hold, taken once the filter is on, still checks it."""
    library = _copy(built, "refused", tmp_path / "libunmapped.so").resolve()
    loader.do("load", library)
    loader.do("seccomp")
    held = code_hold.hold_mapped_code(loader.pid, TRUSTED)
    try:
        loader.do(unload, library)
        assert held.problems == []
        assert _check(loader.pid) == []  # the end's look alone misses it
        assert _check(loader.pid, held) == [_refused(library)]
    finally:
        held.close()


@x86_64_linux
def test_a_library_unlinked_after_loading_is_checked(tmp_path: Path, built, loader: Loader):
    """Unlinked before the hold, then unloaded: the hold opens the mapped file itself."""
    library = _copy(built, "refused", tmp_path / "libgone.so").resolve()
    loader.do("load", library)
    library.unlink()
    loader.do("seccomp")
    held = code_hold.hold_mapped_code(loader.pid, TRUSTED)
    try:
        loader.do("dlclose", library)
        where = f"{library} (deleted)"
        if _map_files_open():
            assert held.problems == []
            assert _check(loader.pid, held) == [_refused(where)]
        else:
            assert held.problems == [f"{where} holds code the judge cannot check "
                                     "(unreadable: Permission denied): not allowed"]
    finally:
        held.close()


def test_one_file_by_many_names_or_copies_is_checked_once(tmp_path: Path, built,
                                                          loader: Loader):
    """The red team's E2: 200 hard links of one library mapped as code are one file, 20
    copies of it one content; the symbols of a content are read once, whatever its path."""
    first = _copy(built, "refused", tmp_path / "links" / "lib0.so")
    links = [first] + [tmp_path / "links" / f"lib{k}.so" for k in range(1, 200)]
    for link in links[1:]:
        os.link(first, link)
    loader.do("map", *links)
    (problem,) = _check(loader.pid)
    assert problem.endswith(f"calls dlsym ({symbol_rules.LOOKUP}): not allowed")
    copies = [_copy(built, "refused", tmp_path / "copies" / f"lib{k}.so") for k in range(20)]
    loader.do("map", *copies)
    assert len(_check(loader.pid)) == 1
    before = symbols._LISTINGS.hits
    symbols.check_file(copies[0], POLICY)
    symbols.check_file(copies[1], POLICY)
    assert symbols._LISTINGS.hits >= before + 2  # keyed by content


def test_too_many_files_or_a_huge_one_are_refused_unread(tmp_path: Path, built):
    """Distinct files of code past the cap are refused in one problem, unread; so is one
    file larger than the judge reads."""
    many = [_copy(built, "plain", tmp_path / "many" / f"lib{k}.so")
            for k in range(mapped.MAX_CODE_FILES + 1)]
    huge = tmp_path / "huge.so"
    with huge.open("wb") as handle:
        handle.truncate(symbols.MAX_CHECKED_BYTES + 1)  # sparse: no disk used
    found, held = {}, {}
    for name, files in {"many": many, "huge": [huge]}.items():
        process = Loader()
        try:
            process.do("map", *files)
            found[name] = _check(process.pid)
            hold = code_hold.hold_mapped_code(process.pid, TRUSTED)
            held[name] = (len(hold.files), [p for p in hold.problems  # no filter here
                                            if "no seccomp filter" not in p])
            hold.close()
        finally:
            process.close()
    too_many = (f"the process maps {len(many)} distinct files of code outside the trusted "
                f"folders (more than {mapped.MAX_CODE_FILES}): not allowed")
    assert held == {"many": (0, [too_many]), "huge": (1, [])}
    assert found == {
        "many": [too_many],
        "huge": [f"{huge.resolve()} holds code the judge cannot check "
                 f"(over {symbols.MAX_CHECKED_BYTES >> 20} MiB): not allowed"]}


@x86_64_linux
def test_a_file_replaced_or_rewritten_after_mapping_is_not_taken_for_it(tmp_path: Path, built,
                                                                        loader: Loader):
    """A plain library renamed over the mapped one is not what is checked (the mapped file
    is); a mapped file rewritten in place after the hold is refused."""
    replaced = _copy(built, "refused", tmp_path / "libreplaced.so").resolve()
    loader.do("load", replaced)
    os.replace(_copy(built, "plain", tmp_path / "libplain.so"), replaced)
    rewritten = _copy(built, "plain", tmp_path / "librewritten.so").resolve()
    loader.do("load", rewritten)
    loader.do("seccomp")
    held = code_hold.hold_mapped_code(loader.pid, TRUSTED)
    try:
        with rewritten.open("r+b") as handle:  # the same inode, other bytes
            handle.write(built["refused"].read_bytes())
        found = _check(loader.pid, held)
    finally:
        held.close()
    first = [_refused(f"{replaced} (deleted)")] if _map_files_open() else [
        f"{replaced} (deleted) holds code the judge cannot check (unreadable: Permission "
        "denied): not allowed"]
    assert sorted(found) == sorted(first + [
        f"{rewritten} holds code that changed after the judge first read it (the file was "
        "written while mapped (its change time moved)): not allowed"])


@x86_64_linux
@pytest.mark.parametrize("how", ["pwrite", "shared-mapping"])
def test_code_written_and_written_back_after_the_hold_is_refused(tmp_path: Path, built,
                                                                 loader: Loader, how: str):
    """A process that patches its own library's file for a while (its private mappings see
    the page cache) and restores the bytes leaves the digest as it was, not the change
    time."""
    import mmap

    library = _copy(built, "plain", tmp_path / "libpatched.so").resolve()
    loader.do("load", library)
    loader.do("seccomp")
    held = code_hold.hold_mapped_code(loader.pid, TRUSTED)
    try:
        original = library.read_bytes()
        with library.open("r+b") as handle:
            if how == "pwrite":
                os.pwrite(handle.fileno(), b"\xcc" * 16, 4096)
                os.pwrite(handle.fileno(), original[4096:4112], 4096)
            else:
                with mmap.mmap(handle.fileno(), 0) as shared:
                    shared[4096:4112] = b"\xcc" * 16
                    shared[4096:4112] = original[4096:4112]
        assert library.read_bytes() == original
        found = _check(loader.pid, held)
    finally:
        held.close()
    assert found == [f"{library} holds code that changed after the judge first read it (the "
                     "file was written while mapped (its change time moved)): not allowed"]


@x86_64_linux
def test_a_thread_without_the_seccomp_filter_is_named(loader: Loader):
    """Without the filter, code could be mapped after the hold: the hold says so, from each
    thread's status in /proc, whatever the process reports."""
    before = code_hold.hold_mapped_code(loader.pid, TRUSTED)
    loader.do("seccomp")
    after = code_hold.hold_mapped_code(loader.pid, TRUSTED)
    before.close()
    after.close()
    assert before.problems == [f"thread {loader.pid}: no seccomp filter (mode 0): new native "
                               "code could be loaded after the judge's snapshot of what the "
                               "process maps"]
    assert after.problems == []


def test_the_watch_holds_once_and_says_when_it_did_not(tmp_path: Path, built, loader: Loader):
    library = _copy(built, "plain", tmp_path / "libwatched.so").resolve()
    loader.do("load", library)
    watch = code_hold.CodeWatch(lambda: loader.pid, TRUSTED)
    assert watch.problems() == ["the judge took no snapshot of the code the process mapped "
                                "while its calls ran"]
    watch()
    (opened,) = [f for f in watch.files() if f.mapped.where == str(library)]
    watch()  # once only: the same descriptor
    assert [f.fd for f in watch.files() if f.mapped.where == str(library)] == [opened.fd]
    watch.close()
    assert watch.files() == []
    gone = code_hold.CodeWatch(lambda: None, TRUSTED)
    gone()
    assert gone.problems() == ["the candidate's interpreter could not be found to hold what "
                               "it maps"]


# --- real judgements ----------------------------------------------------------------------

# The red team's L1 without the judge's globals: PyTorch's at::cpu::add_out in every call,
# its module unmapped when the model is let go (after the last call, before the report).
UNMAPPED = '''
import sys

import torch.nn as nn
from torch.utils.cpp_extension import load_inline

SOURCE = """
#include <torch/extension.h>
#include <ATen/CPUFunctions.h>
torch::Tensor scale_add(torch::Tensor x, torch::Tensor y, double alpha) {
  auto out = torch::empty_like(x);
  at::cpu::add_out(out, y, x, alpha);
  return out;
}
"""
ext = load_inline("loaded_code_unmapped", cpp_sources=SOURCE, functions=["scale_add"])
_ct = getattr(sys, "mod" + "ules")["c" + "types"]
_libc = _ct.CDLL(None)
_libc.munmap.argtypes = [_ct.c_void_p, _ct.c_size_t]


class ModelNew(nn.Module):
    def __init__(self, alpha):
        super().__init__()
        self.alpha = alpha

    def forward(self, x, y):
        return ext.scale_add(x, y, self.alpha)

    def __del__(self):
        for line in open("/proc/self/maps").read().splitlines():
            fields = line.split()
            if len(fields) >= 6 and "loaded_code_unmapped" in fields[5]:
                lo, hi = (int(v, 16) for v in fields[0].split("-"))
                _libc.munmap(lo, hi - lo)
'''


@pytest.mark.slow
@x86_64_linux
@pytest.mark.timeout(900)
def test_a_module_unmapped_after_the_last_call_is_refused(tmp_path: Path):
    """Needs the call driver's ``at_counted`` hook wired to ``retime.code_watch``."""
    result = judge(write_task(tmp_path, "scale_add"),
                   write_file_candidate(tmp_path / "c", UNMAPPED))
    assert rejected(result, "calls at::cpu::add_out"), said(result)


# The red team's E2: 300 hard links of one refused library, mapped as code at import.
MANY_NAMES = '''
import base64
import os
import sys

_mmap = getattr(sys, "mod" + "ules")["mm" + "ap"]
os.makedirs("/tmp/names", exist_ok=True)
with open("/tmp/names/lib0.so", "wb") as _f:
    _f.write(base64.b64decode("{library}"))
_KEEP = []
for _k in range(300):
    _path = f"/tmp/names/lib{{_k}}.so"
    if _k:
        os.link("/tmp/names/lib0.so", _path)
    _fd = os.open(_path, os.O_RDONLY)
    _KEEP.append(_mmap.mmap(_fd, 4096, prot=_mmap.PROT_READ | _mmap.PROT_EXEC,
                            flags=_mmap.MAP_PRIVATE))
    os.close(_fd)
'''


@pytest.mark.timeout(900)
def test_many_names_of_one_library_make_one_refusal(tmp_path: Path, built):
    header = MANY_NAMES.format(library=base64.b64encode(built["refused"].read_bytes())
                               .decode())
    result = judge(write_task(tmp_path, "scale_add"),
                   write_scale_add(tmp_path / "c", scale_add_model(
                       "return cuda_extension.scale_add(x, y, self.alpha)", header)))
    loaded = [r for r in result.reasons if r.startswith("loaded code")]
    assert result.reward == -1 and len(loaded) == 1, said(result)
    assert "/tmp/names/lib" in loaded[0] and "calls dlsym" in loaded[0], said(result)


@x86_64_linux
@pytest.mark.parametrize("view", ["mapw", "mappen", "maprwx"])
def test_code_also_mapped_writable_and_shared_is_refused(tmp_path: Path, built, loader: Loader,
                                                         view: str):
    """Pages of a shared mapping made writable before the hold take later writes without a
    fault, so the change time never moves, and a private mapping both writable and
    executable takes new code in a copied page, touching neither the file nor its change
    time: such a mapping of code is refused, at the hold and at the end."""
    library = _copy(built, "plain", tmp_path / "libwritable.so").resolve()
    loader.do("load", library)
    loader.do(view, library)  # writable now, made read-only after a write, or rwx
    loader.do("seccomp")
    held = code_hold.hold_mapped_code(loader.pid, TRUSTED)
    try:
        assert held.problems == [f"{library} is mapped as code and also shared or writable (a "
                                 "view that could write it, or executable at once): its bytes "
                                 "could change unseen"]
        assert _check(loader.pid, held) == [f"{library} maps code also mapped shared or writable "
                                            "(a view that could write it, or executable at once: "
                                            "its bytes could change unseen): not allowed"]
    finally:
        held.close()


@x86_64_linux
def test_the_judges_own_layer_may_gain_links_while_held(tmp_path: Path, built, loader: Loader):
    """Another judgement's build links the shared fixed layer while this one holds it (its
    change time moves): the judge's own file is not refused for it; a candidate's is."""
    library = _copy(built, "plain", tmp_path / "libfixed.so").resolve()
    loader.do("load", library)
    loader.do("seccomp")
    held = code_hold.hold_mapped_code(loader.pid, TRUSTED)
    try:
        os.link(library, tmp_path / "libfixed-link.so")  # moves the change time
        mine = [str(p) for p in mapped.check_process(
            loader.pid, POLICY, TRUSTED, own=lambda where, fd: where == str(library),
            held=held.files)]
        assert mine == []
        assert len(_check(loader.pid, held)) == 1  # the same change, in a candidate's file
    finally:
        held.close()
