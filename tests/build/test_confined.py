"""A build's compilers run confined (build/confined.py): a source cannot make them read
files outside what the agent's shell sees, use unbounded memory, time or output, or live
past the build (or the judge) that started them."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from cuda_agent.build import BuildConfig, Builder
from cuda_agent.build.confined import Jail, namespaces_work
from cuda_agent.procs import snapshot

needs_ns = pytest.mark.skipif(not namespaces_work(), reason="namespaces cannot be made here")


def _workspace(root: Path, name: str, source: str) -> Path:
    (root / "kernels").mkdir(parents=True)
    (root / "kernels" / name).write_text(source)
    return root


def _secret(tmp: Path) -> tuple[Path, str]:
    """A file the build must not read: under /tmp, beside but outside the workspace, as
    another episode's workspace or the judge's own files are."""
    token = f"SECRET_{uuid.uuid4().hex}"
    path = Path("/tmp") / f"confined-secret-{uuid.uuid4().hex}" / "model_new.py"
    path.parent.mkdir()
    path.write_text(f"{token} x;\nint {token}_n = 1;\n")
    return path, token


@needs_ns
@pytest.mark.parametrize("how", ["include", "has_include", "incbin", "dependency", "symlink"])
def test_a_source_reads_no_file_outside_its_workspace(tmp_path: Path, how: str):
    secret, token = _secret(tmp_path)
    sources = {
        "include": f'#include "{secret}"\n',
        "has_include": f'#if __has_include("{secret}")\n#error "{token[:7]} SEEN"\n#endif\n',
        "incbin": f'asm(".section .rodata\\n.incbin \\"{secret}\\"\\n.previous");\n',
        "dependency": f'#pragma GCC dependency "{secret}"\nint f() {{ return 1; }}\n',
        "symlink": '#include "linked.h"\n',
    }
    root = _workspace(tmp_path / "ws", "k.cpp", sources[how])
    if how == "symlink":
        (root / "kernels" / "linked.h").symlink_to(secret)
    result = Builder(BuildConfig(device="cpu", jobs=1)).build(root)
    try:
        assert token not in result.log
        if how == "has_include":
            assert "SEEN" not in result.log
        if how in ("include", "symlink", "incbin"):
            assert not result.ok
    finally:
        secret.unlink()
        secret.parent.rmdir()


def test_the_same_source_under_jail_off_does_read_it(tmp_path: Path):
    """The case above is a real leak without the confinement (so the test can fail)."""
    secret, token = _secret(tmp_path)
    root = _workspace(tmp_path / "ws", "k.cpp", f'#include "{secret}"\n')
    try:
        result = Builder(BuildConfig(device="cpu", jobs=1, confine="off")).build(root)
        assert token in result.log
    finally:
        secret.unlink()
        secret.parent.rmdir()


def test_an_endless_include_is_bounded_by_memory(tmp_path: Path):
    root = _workspace(tmp_path / "ws", "k.cpp", '#include "/dev/zero"\n')
    result = Builder(BuildConfig(device="cpu", jobs=1, memory_mb=512)).build(root)
    assert not result.ok
    assert "memory" in result.log.lower() or "killed" in result.log.lower(), result.log[-500:]


def test_a_flood_of_errors_is_cut(tmp_path: Path):
    lines = "".join(f"int f{i}() {{ return undefined_{i}; }}\n" for i in range(20000))
    root = _workspace(tmp_path / "ws", "k.cpp", lines)
    builder = Builder(BuildConfig(device="cpu", jobs=1))
    builder._jail = dataclasses.replace(Jail.make("auto", 120, None), output_bytes=100_000)
    result = builder.build(root)
    assert not result.ok
    assert "output cut at 100000 bytes" in result.log


SLOW = textwrap.dedent("""
    constexpr unsigned long spin(unsigned long n) {
        unsigned long x = 0;
        for (unsigned long i = 0; i < n; ++i) x = x * 6364136223846793005ul + i;
        return x;
    }
    static_assert(spin(MARK) != 1, "");
""")


def _compilers(mark: str) -> list[int]:
    pids = []
    for pid in snapshot():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if mark.encode() in cmdline and b"cc1plus" in cmdline:
            pids.append(pid)
    return pids


def _gone(mark: str) -> bool:
    for _ in range(300):  # a process killed by SIGKILL is gone within moments
        if not _compilers(mark):
            return True
        time.sleep(0.1)
    return False


def test_a_compile_past_its_timeout_leaves_no_process(tmp_path: Path):
    mark = f"slow_{uuid.uuid4().hex[:12]}"
    source = SLOW.replace("MARK", "4000000000000ul") + f"int {mark};\n"
    root = _workspace(tmp_path / "ws", f"{mark}.cpp", source)
    config = BuildConfig(device="cpu", jobs=1, timeout_s=3,
                         extra_cflags=("-fconstexpr-ops-limit=4000000000000", f"-D{mark}=1"))
    result = Builder(config).build(root)
    assert not result.ok and "timed out" in result.log
    assert _gone(mark)


def test_a_judge_killed_mid_build_leaves_no_compiler(tmp_path: Path):
    mark = f"slow_{uuid.uuid4().hex[:12]}"
    source = SLOW.replace("MARK", "4000000000000ul")
    root = _workspace(tmp_path / "ws", "k.cpp", source)
    script = textwrap.dedent(f"""
        from pathlib import Path
        from cuda_agent.build import Builder, BuildConfig
        Builder(BuildConfig(device="cpu", jobs=1, extra_cflags=(
            "-fconstexpr-ops-limit=4000000000000", "-D{mark}=1"))).build(Path({str(root)!r}))
    """)
    judge = subprocess.Popen([sys.executable, "-c", script], env=os.environ.copy())
    try:
        for _ in range(1200):  # until the compiler runs (or the judge ended: a failure)
            if _compilers(mark) or judge.poll() is not None:
                break
            time.sleep(0.1)
        assert _compilers(mark), "the compiler never started"
    finally:
        judge.send_signal(signal.SIGKILL)
        judge.wait()
    assert _gone(mark)


@pytest.mark.parametrize("name", ['k"$(touch PWNED).cpp', "k`touch PWNED`.cpp", "a b.cpp",
                                  "-x.cpp", ".hidden.cpp", "k;touch PWNED.cpp"])
def test_a_file_name_outside_the_plain_set_is_refused(tmp_path: Path, name: str):
    """A name reaches compilers' command lines, and nvcc hands them to a shell."""
    root = _workspace(tmp_path / "ws", "ok.cpp", "int f() { return 1; }\n")
    (root / "kernels" / name).write_text("int g() { return 2; }\n")
    result = Builder(BuildConfig(device="cpu", jobs=1)).build(root)
    assert not result.ok and "may hold only letters" in result.log
    assert not list(tmp_path.rglob("PWNED")) and not Path("PWNED").exists()


@pytest.mark.parametrize("kind", ["gch", "fifo", "dir-link", "header-link"])
def test_precompiled_headers_links_and_special_files_are_refused(tmp_path: Path, kind: str):
    root = _workspace(tmp_path / "ws", "k.cpp", '#include "x.h"\nint f() { return X; }\n')
    (root / "kernels" / "x.h").write_text("#define X 1\n")
    if kind == "gch":
        (root / "kernels" / "x.h.gch").mkdir()
        (root / "kernels" / "x.h.gch" / "evil.h").write_text("#define X 42\n")
    elif kind == "fifo":
        os.mkfifo(root / "kernels" / "pipe.h")
    elif kind == "dir-link":
        (tmp_path / "elsewhere").mkdir()
        (root / "kernels" / "more").symlink_to(tmp_path / "elsewhere")
    else:
        (tmp_path / "big.h").write_text("#define Y 2\n")
        (root / "kernels" / "y.h").symlink_to(tmp_path / "big.h")
    result = Builder(BuildConfig(device="cpu", jobs=1)).build(root)
    assert not result.ok
    assert any(word in result.log for word in ("precompiled", "regular file", "links"))


@pytest.mark.parametrize("target", ["kernels/val.cpp", "model_new.py"])
def test_a_source_sees_only_the_headers_and_itself(tmp_path: Path, target: str):
    """An object is cached under its headers' and its own bytes: a source that includes
    another source or the workspace's model_new.py would be keyed without them."""
    root = _workspace(tmp_path / "ws", "a.cpp", f'#include "{Path("..") / target}"\n'
                      "int f() { return VALUE; }\n")
    (root / target).write_text("#define VALUE 1\n")
    result = Builder(BuildConfig(device="cpu", jobs=1)).build(root)
    assert not result.ok and "No such file" in result.log


@needs_ns
def test_a_confined_command_cannot_undo_or_write_past_its_jail(tmp_path: Path):
    scratch, cwd = tmp_path / "scratch", tmp_path / "cwd"
    scratch.mkdir()
    cwd.mkdir()
    probe = Path(sys.prefix) / f"jail-probe-{uuid.uuid4().hex}"
    script = (f"umount -l /tmp && echo UNMOUNTED; touch {probe} && echo WROTE; "
              "touch here && echo CWD; echo tmp=$TMPDIR")
    done = Jail.make("on", 30, None).run(["sh", "-c", script], cwd, scratch, 30)
    assert "UNMOUNTED" not in done.output and "WROTE" not in done.output
    assert "CWD" not in done.output and not probe.exists()
    assert f"tmp={scratch}" in done.output


@pytest.mark.nvcc
@needs_ns
def test_split_nvcc_runs_its_stages_inside_the_jail(tmp_path: Path):
    """The split's stages and merge all write inside the builder's scratch folder, so a
    confined compile keeps the split (no fallback to plain nvcc), /tmp home or not."""
    from cuda_agent.build import nvcc_split, toolchain

    builder = Builder(BuildConfig(device="cuda", arch="90"))
    chain = builder._chain = toolchain.detect("cuda", builder.cache, arch="90")
    root = _workspace(tmp_path / "ws", "k.cu", "__global__ void k(float* x) { x[0] = 1; }\n")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    cmd = builder._command(chain, "kernels/k.cu", str(scratch / "k.o"))
    done = nvcc_split.compile_cu(cmd, root, 120, scratch, builder.jail)
    assert done.ok and done.fallback is None, (done.fallback, done.log)
    assert (scratch / "k.o").is_file()


def test_an_output_over_the_cap_is_not_kept(tmp_path: Path, monkeypatch):
    from cuda_agent.build import builder as builder_module

    monkeypatch.setattr(builder_module, "MAX_OUTPUT_BYTES", 1 << 20)
    source = 'asm(".section .rodata\\n.fill 2097152, 1, 0\\n.previous");\nint f();\n'
    root = _workspace(tmp_path / "ws", "k.cpp", source)
    result = Builder(BuildConfig(device="cpu", jobs=1)).build(root)
    assert not result.ok and "not kept" in result.log


def test_a_process_left_in_a_dead_builds_folder_is_ended(tmp_path: Path):
    from cuda_agent import leftovers

    code = ("from cuda_agent import leftovers; import os, signal; "
            f"print(leftovers.owned_dir('build-', {str(tmp_path)!r}), flush=True); "
            "os.kill(os.getpid(), signal.SIGKILL)")
    made = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    folder = Path(made.stdout.strip())
    stuck = subprocess.Popen(["sleep", "600"], cwd=folder)
    try:
        past = time.time() - 3600
        os.utime(folder, (past, past))
        assert leftovers.sweep("build-", tmp_path) == 1
        assert stuck.wait(timeout=60) == -signal.SIGKILL
    finally:
        stuck.kill()
        stuck.wait()


def test_an_object_carrying_lto_sections_is_refused(tmp_path: Path):
    """Link-time-optimisation sections carry code the symbol check does not read (and
    options the link-time assembler takes): an asm() block can write them."""
    source = ('asm(".section .gnu.lto_.opts,\\"e\\",@progbits\\n.byte 0\\n.previous");\n'
              "int f() { return 1; }\n")
    root = _workspace(tmp_path / "ws", "k.cpp", source)
    result = Builder(BuildConfig(device="cpu", jobs=1)).build(root)
    assert not result.ok and "link-time-optimisation sections" in result.log
    plain = _workspace(tmp_path / "plain", "k.cpp", "int f() { return 1; }\n")
    assert Builder(BuildConfig(device="cpu", jobs=1)).build(plain).ok


@needs_ns
def test_the_kernels_settings_are_read_only_in_the_jail(tmp_path: Path):
    (tmp_path / "s").mkdir()
    script = "test -w /proc/sys/vm/drop_caches && echo WRITABLE || echo READONLY"
    done = Jail.make("on", 30, None).run(["sh", "-c", script], tmp_path, tmp_path / "s", 30)
    assert "READONLY" in done.output, done.output


def test_too_many_files_or_too_long_a_path_is_a_build_error(tmp_path: Path):
    from cuda_agent.build import sources

    root = _workspace(tmp_path / "ws", "k.cpp", "int f() { return 1; }\n")
    for i in range(sources.MAX_FILES):
        (root / "kernels" / f"h{i}.h").write_text("")
    result = Builder(BuildConfig(device="cpu", jobs=1)).build(root)
    assert not result.ok and f"over {sources.MAX_FILES}" in result.log
    deep = _workspace(tmp_path / "deep", "k.cpp", "int f() { return 1; }\n") / "kernels"
    folder = deep / "/".join(["d" * 50] * 4)
    folder.mkdir(parents=True)
    (folder / "x.h").write_text("")
    result = Builder(BuildConfig(device="cpu", jobs=1)).build(deep.parent)
    assert not result.ok and "at most" in result.log
