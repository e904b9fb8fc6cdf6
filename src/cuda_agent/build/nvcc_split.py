"""Compile one ``.cu`` with nvcc's stages run as a small graph instead of one after another.

``nvcc -c`` runs, in turn: the host preprocessor, cudafe++ (host front end; writes the module
id), the device preprocessor, cicc (device compiler; reads the module id, writes the host
stub and the PTX), ptxas, fatbinary and the host compile of cudafe++'s output. The host
compile needs the device code only as the ``fatbinData`` array of ``x.fatbin.c``, so it is
given a stand-in ``x.fatbin.c`` that declares the array under a unique hidden name and runs
beside ptxas and fatbinary. The module id (which names the translation unit's anonymous
namespace on both sides, in host symbols too) is written here before anything runs, from
the source's absolute path as nvcc's own is, and cudafe++ reads it instead of writing it; so
cicc, behind the device preprocessor alone, runs beside the host preprocessor and cudafe++.
The object differs from plain nvcc's by that id alone.
The real fatbin is assembled into a small object of its own, merged with ``ld -r`` and its
symbol made local: one object with the same ``.nv_fatbin`` bytes and global symbols as
plain nvcc's.

The stages come from ``nvcc --dryrun --keep`` for the exact command. Anything unexpected
(another stage, several architectures, relocatable device code, a changed ``fatbin.c``
layout, a failure of this module's own steps) runs the plain command instead. A failing stage
stops the stages nvcc would have run after it, and the log is what nvcc prints: each stage's
output, in nvcc's order, up to the first that failed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import queue
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from cuda_agent.build.confined import Jail, drain

CACHE_MARKER = "nvcc-split/2"
"""Enters the cache key of objects built here, so they never mix with plain nvcc's."""
NVCC_ORDER = ("host-cpp", "cudafe", "device-cpp", "cicc", "ptxas", "fatbinary", "host-cc")
DEPENDS: dict[str, tuple[str, ...]] = {
    "host-cpp": (), "cudafe": ("host-cpp",), "device-cpp": (),
    "cicc": ("device-cpp",),  # the module id it reads is written before any stage runs
    "ptxas": ("cicc",), "fatbinary": ("ptxas",),
    "host-cc": ("cudafe", "cicc"),  # cicc writes the stub the host compile includes
    "fatbin-obj": ("fatbinary",), "merge": ("host-cc", "fatbin-obj"), "localize": ("merge",)}
_HOST_CC = re.compile(r"^(?:[\w.]+-)*(?:gcc|g\+\+|cc|c\+\+|clang|clang\+\+)(?:-[\d.]+)?$")
_ASSIGN = re.compile(r"^([A-Za-z_]\w*)=(.*)$")
_VAR = re.compile(r"\$\{?([A-Za-z_]\w*)\}?")
_SHELL = {"|", "||", "&", "&&", ";", "<", ">", ">>", "2>", "2>&1"}
_HEAD = ('#ifndef __SKIP_INTERNAL_FATBINARY_HEADERS\n#include "fatbinary_section.h"\n#endif\n'
         '#define __CUDAFATBINSECTION  ".nvFatBinSegment"\n'
         '#define __CUDAFATBINDATASECTION  ".nv_fatbin"\n')
_ASM = 'asm(\n".section .nv_fatbin, \\"a\\"\\n"\n".align 8\\n"\n"fatbinData:\\n"\n'
_ASM_END = '".text\\n");\n'
_TAIL = ('#ifdef __cplusplus\nextern "C" {{\n#endif\n'
         'extern const unsigned long long {name}[{size}]{attr};\n'
         '#ifdef __cplusplus\n}}\n#endif\n#ifdef __cplusplus\nextern "C" {{\n#endif\n'
         'static const __fatBinC_Wrapper_t __fatDeviceText __attribute__ ((aligned (8))) '
         '__attribute__ ((section (__CUDAFATBINSECTION)))= \n'
         '\t{{ 0x466243b1, 1, {name}, 0 }};\n#ifdef __cplusplus\n}}\n#endif\n')
_FATBIN_ASM = ('\t.section .nv_fatbin,"a"\n\t.align 8\n\t.globl {symbol}\n\t.hidden {symbol}\n'
               '{symbol}:\n\t.incbin "{fatbin}"\n\t.balign 8\n'
               '\t.section .note.GNU-stack,"",@progbits\n')


class PlanError(ValueError):
    """The dry run holds something this module does not split; compile with plain nvcc."""


@dataclasses.dataclass(frozen=True)
class Stage:
    """One command of the graph: what it is, its arguments and the stages it waits for."""

    kind: str
    argv: tuple[str, ...]
    after: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Plan:
    """The stages in nvcc's order (then the merge), their environment and files to write."""

    stages: tuple[Stage, ...]
    env: tuple[tuple[str, str], ...]
    files: tuple[tuple[Path, str], ...]
    fatbin: Path
    nvcc_fatbin_c: Path
    """Where fatbinary writes its own ``fatbin.c``: only read to check its layout."""


@dataclasses.dataclass(frozen=True)
class Compiled:
    """Outcome of one compile; ``fallback`` says why plain nvcc ran (None: it was split)."""

    ok: bool
    log: str
    fallback: str | None = None


def compile_cu(cmd: Sequence[str], cwd: Path, timeout_s: float,
               scratch: Path | None = None, jail: Jail | None = None) -> Compiled:
    """Run ``nvcc ... -c SRC -o OBJ`` (``-o OBJ`` last) split into stages, or plainly.

    The stages' files go to a fresh folder under ``scratch`` (default: the system's temporary
    folder), removed on every path; ``timeout_s`` bounds the whole compile. Every process
    runs through ``jail`` (default: the limits alone), writing only under ``scratch``.
    """
    deadline = time.monotonic() + timeout_s
    keep = Path(tempfile.mkdtemp(prefix="nvcc-split-", dir=scratch)).resolve()
    jail = jail or Jail(isolated=False)
    try:
        plan = plan_stages(_dry_run(cmd, cwd, keep, timeout_s, jail), keep, cmd[-1])
        # the stages write in ``keep``, the object in ``scratch`` (which holds ``keep``)
        status, log = _execute(plan, cwd, deadline, jail, scratch or keep)
        if status == "timeout":
            return Compiled(False, _timed_out(timeout_s))
        if status != "fallback":
            return Compiled(status == "ok", log)
        reason = log
    except (PlanError, OSError) as exc:
        reason = str(exc)
    finally:
        shutil.rmtree(keep, ignore_errors=True)
    return dataclasses.replace(run_command(cmd, cwd, timeout_s, deadline, jail, scratch),
                               fallback=reason)


def run_command(cmd: Sequence[str], cwd: Path, timeout_s: float,
                deadline: float | None = None, jail: Jail | None = None,
                scratch: Path | None = None) -> Compiled:
    """Run one compiler command as it is (through ``jail``, writing under ``scratch``,
    default ``cwd``); the log is what it printed."""
    limit = timeout_s if deadline is None else max(deadline - time.monotonic(), 0.0)
    done = (jail or Jail(isolated=False)).run(list(cmd), cwd, scratch or cwd, limit)
    if done.timed_out:
        return Compiled(False, _timed_out(timeout_s))
    return Compiled(done.code == 0, done.output)


def plan_stages(dry_run: str, keep: Path, obj: str) -> Plan:
    """Turn the dry run's text into the graph; raises PlanError on anything unexpected."""
    env, commands = _parse(dry_run)
    kinds = tuple(_classify(argv) for argv in commands)
    if kinds != NVCC_ORDER:
        raise PlanError(f"unexpected stages: {' '.join(kinds)}")
    by = dict(zip(kinds, commands, strict=True))
    cudafe, cicc, fatbinary, host_cc = by["cudafe"], by["cicc"], by["fatbinary"], by["host-cc"]
    if "--static-host-stub" not in cudafe or "--gen_module_id_file" not in cudafe:
        raise PlanError("not a whole-program compile")
    module_id = _option(cudafe, "--module_id_file_name")
    if module_id != _option(cicc, "--module_id_file_name"):
        raise PlanError("cudafe++ and cicc disagree on the module id file")
    stub, include = _option(cicc, "--stub_file_name"), _option(cicc, "--include_file_name")
    fatbin, embedded = _prefixed(fatbinary, "--create="), _prefixed(fatbinary, "--embedded-fatbin=")
    if not (stub and include and fatbin and embedded) or _option(host_cc, "-o") != obj:
        raise PlanError("the stages do not name the files expected")
    stand_in = Path(stub).parent / include
    if Path(embedded) != stand_in or keep != stand_in.parent or keep != Path(fatbin).parent:
        raise PlanError("fatbin.c is not where the host stub includes it from")
    source = _option(cudafe, "--orig_src_path_name")
    if not module_id or not source or Path(module_id).parent != keep:
        raise PlanError("the module id file is not in the stages' folder")
    by["cudafe"] = [a for a in cudafe if a != "--gen_module_id_file"]  # it reads ours
    symbol, nvcc_c = f"__cuda_agent_fatbin_{uuid.uuid4().hex}", keep / "nvcc.fatbin.c"
    by["fatbinary"] = [f"--embedded-fatbin={nvcc_c}" if a == f"--embedded-fatbin={embedded}"
                       else a for a in fatbinary]
    by["host-cc"] = _with_output(host_cc, str(keep / "host.o"))
    path = env.get("PATH", os.environ.get("PATH", ""))
    width = [a for a in host_cc if a in ("-m64", "-m32")]
    by["fatbin-obj"] = [host_cc[0], *width, "-c", "-x", "assembler", str(keep / "fatbin.s"),
                        "-o", str(keep / "fatbin.o")]
    by["merge"] = [_tool("ld", path), "-r", str(keep / "host.o"),
                   str(keep / "fatbin.o"), "-o", obj]
    by["localize"] = [_tool("objcopy", path), f"--localize-symbol={symbol}", obj]
    files = ((stand_in, _HEAD + _TAIL.format(name=symbol, size="",
                                             attr=' __attribute__((visibility("hidden")))')),
             (keep / "fatbin.s", _FATBIN_ASM.format(symbol=symbol, fatbin=fatbin)),
             (Path(module_id), module_identifier(source)))
    stages = tuple(Stage(kind, tuple(argv), DEPENDS[kind]) for kind, argv in by.items())
    return Plan(stages, tuple(env.items()), files, Path(fatbin), nvcc_c)


def module_identifier(source: str) -> str:
    """The module id of ``source`` (its absolute path), in nvcc's layout:
    ``_HASH_LENGTH_NAME_HASH``; unique per path, as nvcc's is."""
    digest = hashlib.sha256(f"cuda-agent module id\0{source}".encode()).hexdigest()
    name = Path(source).name
    return f"_{digest[:8]}_{len(name)}_{re.sub(r'[^A-Za-z0-9]', '_', name)}_{digest[8:16]}"


def _dry_run(cmd: Sequence[str], cwd: Path, keep: Path, timeout_s: float,
             jail: Jail | None = None) -> str:
    argv = [cmd[0], "--dryrun", "--keep", "--keep-dir", str(keep), *cmd[1:]]
    if len(cmd) < 3 or cmd[-2] != "-o":
        raise PlanError("the command does not end in -o OBJ")
    try:
        done = (jail or Jail(isolated=False)).run(argv, cwd, keep, timeout_s)
    except OSError as exc:
        raise PlanError(f"nvcc --dryrun: {exc}") from exc
    if done.timed_out or done.code != 0:
        raise PlanError("nvcc --dryrun failed")
    return done.output


def _parse(text: str) -> tuple[dict[str, str], list[list[str]]]:
    """nvcc's environment assignments and its commands, variables expanded."""
    env: dict[str, str] = {}
    commands: list[list[str]] = []
    for line in filter(str.strip, text.splitlines()):
        if not line.startswith("#$ "):
            raise PlanError(f"unexpected dry-run output: {line[:100]}")
        body = line[3:].strip()
        assign = _ASSIGN.match(body)
        if assign:
            env[assign[1]] = " ".join(_split(assign[2]))
            continue
        argv = _split(_VAR.sub(lambda m: _lookup(env, m[1]), body))
        if not argv or _SHELL.intersection(argv):
            raise PlanError(f"not a plain command: {body[:100]}")
        commands.append(argv)
    return env, commands


def _split(text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError as exc:
        raise PlanError(f"cannot parse: {text[:100]}") from exc


def _lookup(env: dict[str, str], name: str) -> str:
    value = env.get(name)
    if value is None or any(c in value for c in "\"'\\$`"):
        raise PlanError(f"cannot expand ${name}")
    return value


def _classify(argv: list[str]) -> str:
    """The stage a command is, by its program (and, for the host compiler, its mode)."""
    prog = Path(argv[0]).name
    if prog in ("cudafe++", "cicc", "ptxas", "fatbinary"):
        return "cudafe" if prog == "cudafe++" else prog
    out = _option(argv, "-o") or ""
    if _HOST_CC.match(prog) and "-E" in argv:
        if out.endswith(".cpp4.ii"):
            return "host-cpp"
        if out.endswith(".cpp1.ii"):
            return "device-cpp"
    elif _HOST_CC.match(prog) and "-c" in argv:
        return "host-cc"
    raise PlanError(f"unexpected stage: {shlex.join(argv)[:120]}")


def _option(argv: Sequence[str], name: str) -> str | None:
    hits = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == name]
    return hits[0] if len(hits) == 1 else None


def _prefixed(argv: Sequence[str], prefix: str) -> str | None:
    hits = [a[len(prefix):] for a in argv if a.startswith(prefix)]
    return hits[0] if len(hits) == 1 else None


def _with_output(argv: Sequence[str], out: str) -> list[str]:
    i = list(argv).index("-o")
    return [*argv[:i + 1], out, *argv[i + 2:]]


def _tool(name: str, path: str) -> str:
    tool = shutil.which(name, path=path)
    if tool is None:
        raise PlanError(f"{name} not found")
    return tool


def _execute(plan: Plan, cwd: Path, deadline: float, jail: Jail, scratch: Path
             ) -> tuple[str, str]:
    """Run the graph: ("ok" | "failed", log), ("timeout", "") or ("fallback", reason)."""
    for path, text in plan.files:
        path.write_text(text)
    # their temporary files go beside the stages' own, removed with them
    env = {**os.environ, **dict(plan.env), "TMPDIR": str(plan.fatbin.parent)}
    stages, index = plan.stages, {s.kind: i for i, s in enumerate(plan.stages)}
    done: queue.Queue[tuple[int, int, str]] = queue.Queue()
    procs: dict[int, subprocess.Popen[bytes]] = {}
    waiters: list[threading.Thread] = []
    results: dict[int, tuple[int, str]] = {}
    cutoff = len(stages)  # the first failed stage in nvcc's order; later ones are stopped
    try:
        while True:
            for i, stage in enumerate(stages):
                if i < cutoff and i not in procs and all(
                        results.get(index[dep], (1, ""))[0] == 0 for dep in stage.after):
                    try:
                        procs[i] = jail.start(stage.argv, cwd, scratch, env)
                    except OSError as exc:
                        return "fallback", f"{stage.kind}: {exc}"
                    waiters.append(threading.Thread(
                        target=_wait, args=(i, procs[i], done, jail.output_bytes, deadline)))
                    waiters[-1].start()
            running = [i for i in procs if i not in results]
            if not running:
                break
            try:
                i, code, out = done.get(timeout=max(deadline - time.monotonic(), 0.001))
            except queue.Empty:
                return "timeout", ""
            results[i] = (code, out)
            kind = stages[i].kind  # a stage after ``cutoff`` that fails was stopped by it
            if code and i < cutoff and kind not in NVCC_ORDER:
                return "fallback", f"{kind} failed: {out.strip()[:300]}"
            if code and i < cutoff:
                cutoff = i
                _kill(procs[j] for j in running if j > i)
            elif kind == "fatbinary" and not code and (reason := _check_layout(plan)):
                return "fallback", reason
    finally:
        _kill(procs.values())
        for waiter in waiters:
            waiter.join()
        for proc in procs.values():
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
    status = "failed" if cutoff < len(stages) else "ok"
    return status, "".join(results[i][1] for i in sorted(results) if i <= cutoff)


def _wait(i: int, proc: subprocess.Popen[bytes], done: queue.Queue, limit: int,
          deadline: float) -> None:
    out = drain(proc, limit, deadline)
    done.put((i, proc.returncode if out is not None else -9, out or ""))


def _kill(procs) -> None:
    """Stop still-running stages with everything they started (own process group each)."""
    for proc in procs:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)


def _check_layout(plan: Plan) -> str | None:
    """None if fatbinary's own fatbin.c is laid out as the stand-in assumes."""
    try:
        text, size = plan.nvcc_fatbin_c.read_text(), plan.fatbin.stat().st_size
    except OSError as exc:
        return f"fatbinary output: {exc}"
    end = text.find(_ASM_END)
    words = text.count("0x", 0, end)
    tail = _TAIL.format(name="fatbinData", size=words, attr="")
    if (not text.startswith(_HEAD + _ASM) or end < 0 or words != (size + 7) // 8
            or text[end + len(_ASM_END):] != tail):
        return "fatbin.c is not laid out as expected"
    return None


def _timed_out(timeout_s: float) -> str:
    return f"compiler timed out after {timeout_s:.0f} s"
