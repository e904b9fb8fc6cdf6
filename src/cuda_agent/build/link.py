"""Linking: the fixed layer once per toolchain into a shared library, each module against it.

The fixed layer (``binding.cpp`` and, for CUDA, the device timer) is the only code that
uses torch. It is linked once per toolchain, with libtorch, into
``libcuda_agent_fixed_KEY.so``, with ``-Bsymbolic`` so that its own calls never bind to a
symbol of the same name in a candidate's objects. A module is then only the kernel objects
linked against that library (and cudart and cuBLAS on CUDA), so the linker no longer reads
libtorch's symbol tables on every edit: on a 2-core machine, 40_LayerNorm's CPU kernels
linked in 0.68 s against libtorch and in 0.10 s this way. Python finds
``PyInit_cuda_extension`` in the library (a dependency of the module); a module that defines
an entry point or any other symbol of the fixed layer's is refused. A copy of the library
sits next to each module (``$ORIGIN``); ``load_extension`` loads it before the module, so
that its symbols are bound before any of a candidate's could stand in for them (a candidate
defining ``cudaEventRecord`` reaches only its own calls). The library alone is the tracer
module (``Builder.build_tracer``).

    fixed = link.fixed_library(chain, objects, cache, run)    # (ok, log, path)
    module = link.module(chain, kernel_objects, fixed.path, cache, run)
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

from cuda_agent.build import bounded, symbols
from cuda_agent.build.toolchain import Toolchain

MODULE_NAME = "cuda_extension"
CLAIMS_SHOWN = 20
"""The most claimed names a refused module's log names (one by one, each demangled)."""
FIXED_PREFIX = "libcuda_agent_fixed_"
_UNDEFINED = re.compile(r"undefined reference to `([^'`]+)'")

Run = Callable[[list[str], Path, Path], tuple[bool, str]]
"""Runs a link command whose last argument is replaced by a temporary output, then moves
it to the given path: ``(ok, log)`` (``Builder._compile``)."""


@dataclasses.dataclass(frozen=True)
class Linked:
    ok: bool
    log: str
    path: Path | None


def fixed_library(chain: Toolchain, objects: list[Path], cache: Path, run: Run) -> Linked:
    """The fixed layer's objects linked with libtorch (cached by the objects' keys)."""
    libs = ["-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python"]
    if chain.device == "cuda":
        libs += ["-lc10_cuda", "-ltorch_cuda", *_cuda_libs(chain)]
    key = _hash(chain.fingerprint, *map(str, objects), *libs)
    name = f"{FIXED_PREFIX}{key[:16]}.so"
    cmd = [chain.cxx, "-shared", *map(str, objects), f"-L{chain.torch_lib}",
           f"-Wl,-rpath,{chain.torch_lib}", *libs, "-fopenmp", "-Wl,-Bsymbolic",
           f"-Wl,-soname,{name}", *_strict(), "-o", "OUT"]
    return _link(cmd, cache / "fixed" / key[:32] / name, cache, run)


def module(chain: Toolchain, objects: list[Path], fixed: Path, cache: Path, run: Run
           ) -> Linked:
    """The kernel objects linked against the fixed library into ``cuda_extension``."""
    libs = _cuda_libs(chain) if chain.device == "cuda" else []
    cmd = [chain.cxx, "-shared", *map(str, objects), str(fixed), "-Wl,-rpath,$ORIGIN",
           *libs, "-fopenmp", *_strict(), "-o", "OUT"]
    key = _hash(chain.fingerprint, " ".join(cmd))
    out = cache / "ext" / key[:32] / f"{MODULE_NAME}{chain.ext_suffix}"
    fresh = not out.exists()
    linked = _link(cmd, out, cache, run)
    if linked.ok and fresh:
        try:
            claimed = claimed_symbols(out, fixed)
        except bounded.OutputLimit:
            out.unlink(missing_ok=True)
            return Linked(False, "error: the module lists more symbols than the judge reads "
                                 f"(over {symbols.MAX_SYMBOLS}, or over "
                                 f"{symbols.MAX_SYMBOL_BYTES >> 20} MiB of names)\n", None)
        if claimed:
            out.unlink(missing_ok=True)
            more = len(claimed) - CLAIMS_SHOWN
            return Linked(False, "".join(f"error: a kernel source defines `{name}`{_plain(name)}"
                                         ", which belongs to the fixed layer\n"
                                         for name in claimed[:CLAIMS_SHOWN])
                          + (f"error: and {more} more of the fixed layer's symbols\n"
                             if more > 0 else ""), None)
    if linked.ok and not (out.parent / fixed.name).is_file():
        place(fixed, out.parent)
    return linked


def place(library: Path, folder: Path) -> None:
    """A copy of ``library`` in ``folder`` (a hard link where it can be)."""
    target = folder / library.name
    staging = folder / f".{library.name}.{os.getpid()}.tmp"
    try:
        os.link(library, staging)
    except OSError:
        shutil.copy2(library, staging)
    os.replace(staging, target)


def claimed_symbols(module_path: Path, fixed: Path) -> list[str]:
    """Symbols the module defines that are the fixed layer's: Python entry points
    (``PyInit_*``, ``PyModExport_*``), the ``cuda_agent_`` prefix, and any symbol the fixed
    library defines itself (not weak), in any visibility. Linked into one file, these were
    duplicate definitions; against the library, the module's would win for its own calls
    (its outputs not poisoned) and for Python's lookup of the entry point. Raises
    ``bounded.OutputLimit`` where either lists more than ``symbols.MAX_SYMBOLS`` (or
    ``symbols.MAX_SYMBOL_BYTES``)."""
    own = {name for kind, name in _symbols(fixed, dynamic=True)  # not the linker's _end...
           if kind in "TDBR" and (name.startswith("_Z") or not name.startswith("_"))}
    return sorted({name for kind, name in _symbols(module_path, dynamic=False)
                   if kind not in "UuwvN" and (name in own or name.startswith(
                       ("PyInit_", "PyModExport_", "cuda_agent_")))})


def _plain(name: str) -> str:
    """`` (demangled)`` for a C++ name, where c++filt is at hand."""
    tool = shutil.which("c++filt")
    if not name.startswith("_Z") or tool is None:
        return ""
    done = subprocess.run([tool, name], capture_output=True, text=True, timeout=30)
    return f" ({done.stdout.strip()})" if done.returncode == 0 else ""


def _symbols(path: Path, dynamic: bool) -> Iterator[tuple[str, str]]:
    """(nm type letter, name) of the symbols ``path`` defines, as ``nm`` lists them."""
    nm = shutil.which("nm")
    if nm is None:
        raise RuntimeError("nm (binutils) is needed to check a module's symbols")
    with bounded.Lines([nm, *(["-D"] if dynamic else []), "--defined-only", str(path)],
                       symbols.MAX_SYMBOLS, symbols.MAX_SYMBOL_BYTES, timeout=60) as out:
        for line in out:
            row = line.split()
            if len(row) >= 2:
                yield row[-2], row[-1]


def _cuda_libs(chain: Toolchain) -> list[str]:
    return [f"-L{Path(chain.cuda_home or '') / 'lib64'}", "-lcudart", "-lcublas"]


def _strict() -> list[str]:
    # --no-undefined names every unresolved symbol (a launcher declared in a binding but
    # defined nowhere); --noinhibit-exec still writes the library, since the Python API
    # symbols are only resolved when the interpreter loads it. No link-time optimisation:
    # its code comes from an object's LTO sections, which the symbol check does not see
    # and whose options (carried in the object) reach the link-time assembler.
    return ["-Wl,--no-undefined", "-Wl,--noinhibit-exec", "-fno-lto",
            "-fno-use-linker-plugin"]


def _link(cmd: list[str], out: Path, cache: Path, run: Run) -> Linked:
    if out.exists():
        return Linked(True, "", out)
    ok, log = run(cmd, cache, out)
    missing = sorted({m for m in _UNDEFINED.findall(log) if not m.startswith(("Py", "_Py"))})
    if missing:
        out.unlink(missing_ok=True)
        return Linked(False, "".join(f"error: undefined symbol `{m}`: declared but defined "
                                     "in no kernel source\n" for m in missing), None)
    return Linked(ok, "" if ok else log, out if ok else None)


def _hash(*parts: str) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()
