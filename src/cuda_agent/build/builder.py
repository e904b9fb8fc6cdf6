"""Build ``kernels/`` into the ``cuda_extension`` module, one cached object per source.

Each kernel source compiles to its own object file, stored under a key that hashes the
source, the headers it may include, the flags and the toolchain; the fixed layer compiles
once per toolchain: the binding layer (``binding.cpp``, the only file that includes torch
headers) and, for CUDA, the judge's device timer (``judge_timer.cu``, kept in this package,
never in a workspace), linked once with libtorch into a shared library; each module is the
kernel objects linked against it (``link.py``). Editing one kernel recompiles that file and
relinks the module. Before the link, what the objects call is checked (``symbols.py``): a
kernel that calls PyTorch, Python, dynamic lookup or another library's arithmetic fails the
build with one error per source and symbol.

    from cuda_agent.build import Builder, BuildConfig
    result = Builder(BuildConfig(device="cpu")).build(workspace_dir)
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from cuda_agent import leftovers
from cuda_agent.build import diagnostics, link, nvcc_split, sources, symbols, toolchain
from cuda_agent.build.confined import Jail
from cuda_agent.build.link import MODULE_NAME
from cuda_agent.build.sources import KernelFiles
from cuda_agent.build.toolchain import Toolchain, ToolchainError
from cuda_agent.paths import TEMPLATES, home_dir
from cuda_agent.results import BuildResult, Diagnostic

MAX_OUTPUT_BYTES = 256 << 20
"""An object or module larger than this is not kept (a build's cache stays bounded)."""
REGISTRY = TEMPLATES / "common" / "binding_registry.h"
BINDING_LABEL = "binding.cpp (fixed layer, once per toolchain)"
TIMER_LABEL = "judge_timer.cu (fixed layer, once per toolchain)"
TIMER_SOURCE = Path(__file__).resolve().parent / "judge_timer.cu"
SCRATCH_DIR = "build-"
FIXED_LAYER_VERSION = "2"
"""Enters the fixed layer's cache keys; bump when how it is built changes (2: device timer)."""


class BuildConfig(BaseModel):
    """How kernels are compiled and where objects are cached."""

    device: Literal["cpu", "cuda"] = Field("cpu", description="Target: C++ on the CPU or CUDA.")
    cache_dir: Path | None = Field(
        None, description="Object cache; default $CUDA_AGENT_HOME/build.")
    cxx: str | None = Field(None, description="C++ compiler; default $CXX or g++.")
    arch: str | None = Field(None, description="CUDA target such as '90a'; default: the device's.")
    jobs: int = Field(0, description="Parallel compiles; 0 means one per CPU core.")
    timeout_s: float = Field(300.0, description="Limit for one compiler invocation.")
    extra_cflags: tuple[str, ...] = Field((), description="Added to every C++ compile.")
    extra_cuda_cflags: tuple[str, ...] = Field((), description="Added to every nvcc compile.")
    max_sources: int = Field(64, description="Refuse workspaces with more kernel sources.")
    split_nvcc: bool = Field(True, description=(
        "Run nvcc's stages for a kernel .cu as a graph (the host compile beside ptxas; the "
        "same object, about 0.8 s sooner); False runs the plain nvcc command."))
    confine: Literal["auto", "on", "off"] = Field("auto", description=(
        "Run every compiler and linker process in namespaces of its own (confined.py: /tmp "
        "hidden, its folder read-only, killed with the build): 'auto' where they can be "
        "made, 'on' refuses to build without them, 'off' never (the limits still apply)."))
    memory_mb: int | None = Field(None, ge=256, description=(
        "RLIMIT_AS of each compiler process, MiB; None: the machine's memory over twice the "
        "parallel compiles, between 2 and 8 GiB."))

    def resolved_cache(self) -> Path:
        return Path(self.cache_dir) if self.cache_dir else home_dir() / "build"


class Builder:
    """Incremental builder for one device; safe to share between threads and processes."""

    def __init__(self, config: BuildConfig | None = None):
        self.config = config or BuildConfig()
        self.cache = self.config.resolved_cache()
        self._chain: Toolchain | None = None
        self._jail: Jail | None = None

    @property
    def chain(self) -> Toolchain:
        if self._chain is None:
            self._chain = toolchain.detect(self.config.device, self.cache, self.config.cxx,
                                           self.config.arch)
        return self._chain

    @property
    def jail(self) -> Jail:
        """How this builder's compilers run (``confined.py``)."""
        if self._jail is None:
            chain = self.chain
            needs = [*chain.torch_includes, chain.python_include, chain.cuda_home,
                     *_flag_paths([*self.config.extra_cflags, *self.config.extra_cuda_cflags])]
            leftovers.sweep(SCRATCH_DIR, self.cache / "scratch")  # of builds killed outright
            self._jail = Jail.make(self.config.confine, self.config.timeout_s, self._memory(),
                                   [p for p in needs if p])
        return self._jail

    def _memory(self) -> int:
        if self.config.memory_mb is not None:
            return self.config.memory_mb << 20
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        jobs = self.config.jobs or os.cpu_count() or 1
        return min(max(ram // (2 * jobs), 2 << 30), 8 << 30)

    def build(self, root: Path, publish: bool = False) -> BuildResult:
        """Build ``root/kernels`` and return where the module is; never raises on bad code.

        With ``publish``, the module is also copied to ``root/build/`` for the agent to use.
        """
        start = time.perf_counter()
        root = Path(root).resolve()
        try:
            files = self.kernel_files(root)
            chain = self.chain
        except (ToolchainError, ValueError, OSError) as exc:
            diag = Diagnostic(None, None, None, "error", str(exc))
            return BuildResult(False, self.config.device, None, (diag,), log=str(exc))
        jobs = self.config.jobs or os.cpu_count() or 1
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            fixed_jobs = [(label, pool.submit(self._fixed_object, chain, source, heavy))
                          for label, source, heavy in self._fixed_sources(chain)]
            units = list(pool.map(lambda s: self._object(s, chain, files),
                                  [rel for rel, _ in files.sources]))
            fixed = [(label, *job.result()) for label, job in fixed_jobs]
        logs = [u[3] for u in units if u[3]]
        for label, ok, log, _ in fixed:
            if not ok:
                logs.insert(0, f"fixed layer ({label.split()[0]}) failed to compile:\n{log}")
        fresh = tuple(label for label, ok, log, _ in fixed if ok and log is not None)
        compiled = (*fresh, *(u[0] for u in units if u[1] == "compiled"))
        cached = tuple(u[0] for u in units if u[1] == "cached")
        failed = [u for u in units if u[1] == "failed"]
        ext = fixed_lib = None
        compiled_all = all(f[1] for f in fixed) and not failed
        refused = _refused_calls(chain, units, self.cache) if compiled_all else ()
        if compiled_all and not refused:
            fixed_lib = link.fixed_library(chain, [f[3] for f in fixed], self.cache,
                                           self._compile)
            linked = link.module(chain, [u[2] for u in units], fixed_lib.path, self.cache,
                                 self._compile) if fixed_lib.ok and fixed_lib.path else fixed_lib
            ext = linked.path
            if not linked.ok:
                logs.append(linked.log)
        log = diagnostics.join_logs(logs)
        diags = (*refused, *diagnostics.parse(log))
        if refused:
            log = "\n".join([*map(str, refused), log]).strip()
        if ext is None and not any(d.severity == "error" for d in diags):
            diags = (Diagnostic(None, None, None, "error", "build failed; see log"), *diags)
        if ext and publish:
            out = root / "build"
            out.mkdir(exist_ok=True)
            shutil.copy2(ext, out / f"{MODULE_NAME}{chain.ext_suffix}")
            if fixed_lib is not None and fixed_lib.path is not None:  # found by $ORIGIN
                for old in out.glob(f"{link.FIXED_PREFIX}*.so"):
                    if old.name != fixed_lib.path.name:
                        old.unlink()
                if not (out / fixed_lib.path.name).is_file():
                    shutil.copy2(fixed_lib.path, out / fixed_lib.path.name)
        return BuildResult(ext is not None, self.config.device, str(ext) if ext else None, diags,
                           compiled, cached, time.perf_counter() - start,
                           diagnostics.trim_log(log))

    def build_tracer(self) -> str:
        """The fixed layer linked alone: a module with the judge's process-wide operator
        trace (``_trace_begin``/``_trace_end``) for candidates that bring no workspace and,
        for CUDA, the device timer (``_block_device``/``_blocker_info``) for any process."""
        chain = self.chain
        objects = []
        for label, source, heavy in self._fixed_sources(chain):
            ok, log, obj = self._fixed_object(chain, source, heavy)
            if not ok:
                raise ToolchainError(f"fixed layer ({label.split()[0]}) failed to compile:\n"
                                     f"{log}")
            objects.append(obj)
        linked = link.fixed_library(chain, objects, self.cache, self._compile)
        if not linked.ok or linked.path is None:
            raise ToolchainError(f"tracer module failed to link:\n{linked.log}")
        return str(linked.path)

    def kernel_files(self, root: Path) -> KernelFiles:
        """``root/kernels`` read once and checked (``sources.kernel_files``)."""
        wanted = (".cpp", ".cu") if self.config.device == "cuda" else (".cpp",)
        return sources.kernel_files(Path(root).resolve(), wanted, self.config.max_sources,
                                    REGISTRY.read_bytes())

    def _command(self, chain: Toolchain, source: str, obj: str, heavy: bool = False
                 ) -> list[str]:
        abi = f"-D_GLIBCXX_USE_CXX11_ABI={chain.cxx11_abi}"
        includes = [f"-I{TEMPLATES / 'common'}", "-Ikernels"]
        if chain.cuda_home:
            includes.append(f"-I{Path(chain.cuda_home) / 'include'}")
        if source.endswith(".cu"):
            gencode = f"-gencode=arch=compute_{chain.arch},code=sm_{chain.arch}"
            return [chain.nvcc, "-O3", "-std=c++17", "-lineinfo", gencode, abi,
                    "-Xcompiler", "-fPIC", *includes, *self.config.extra_cuda_cflags,
                    "-c", source, "-o", obj]
        flags = ["-O3", "-march=native", "-fopenmp"] if chain.device == "cpu" else ["-O2"]
        if heavy:
            flags = ["-O2", f"-DTORCH_EXTENSION_NAME={MODULE_NAME}",
                     "-DTORCH_API_INCLUDE_EXTENSION_H", *(f"-I{i}" for i in chain.torch_includes),
                     f"-I{chain.python_include}"]
            if chain.device == "cuda":
                flags.append("-DCUDA_EXT_WITH_CUDA")
        return [chain.cxx, *flags, "-std=c++17", "-fPIC", abi, *includes,
                *self.config.extra_cflags, "-c", source, "-o", obj]

    def _object_path(self, key: str) -> Path:
        return self.cache / "objects" / key[:2] / f"{key}.o"

    def _compile(self, cmd: list[str], cwd: Path | None, obj: Path, split: bool = False,
                 view: tuple[KernelFiles, Path] | None = None) -> tuple[bool, str]:
        """Run ``cmd`` (its last argument replaced by a file in a fresh scratch folder, the
        only place it may write) confined, in ``cwd`` or, given ``view`` (the kernel files
        and a source), in that source's view; move the output to ``obj``."""
        jail = self.jail
        obj.parent.mkdir(parents=True, exist_ok=True)
        (self.cache / "scratch").mkdir(parents=True, exist_ok=True)
        owned = leftovers.owned_dir(SCRATCH_DIR, self.cache / "scratch")
        try:
            scratch = owned / "out"
            scratch.mkdir()
            if view is not None:
                cwd = sources.write_view(*view, owned / "view")
            out = scratch / obj.name
            cmd = [*cmd[:-1], str(out)]
            if split:
                done = nvcc_split.compile_cu(cmd, cwd, self.config.timeout_s, scratch, jail)
            else:
                done = nvcc_split.run_command(cmd, cwd, self.config.timeout_s, None, jail,
                                              scratch)
            if not (done.ok and out.is_file() and not out.is_symlink()):
                return False, done.log
            if out.stat().st_size > MAX_OUTPUT_BYTES:
                return False, (f"{done.log}\nerror: the compiler's output is over "
                               f"{MAX_OUTPUT_BYTES >> 20} MiB; not kept\n")
            if view is not None and (refused := _lto_refusal(out, view[1])):
                return False, f"{done.log}\n{refused}"
            os.replace(out, obj)
            return True, done.log
        finally:
            shutil.rmtree(owned, ignore_errors=True)

    def _object(self, source: Path, chain: Toolchain, files: KernelFiles
                ) -> tuple[str, str, Path, str]:
        cmd = self._command(chain, str(source), "OUT")
        split = self.config.split_nvcc and source.suffix == ".cu"
        command = " ".join(cmd) + (f" {nvcc_split.CACHE_MARKER}" if split else "")
        key = _hash(chain.fingerprint, files.header_hash, command, dict(files.sources)[source])
        obj = self._object_path(key)
        if obj.exists():
            return str(source), "cached", obj, ""
        try:
            ok, log = self._compile(cmd, None, obj, split, (files, source))
        except OSError as exc:  # the view or the scratch could not be written
            ok, log = False, f"{source}: error: cannot be compiled here: {exc.strerror}\n"
        return str(source), "compiled" if ok else "failed", obj, log

    @staticmethod
    def _fixed_sources(chain: Toolchain) -> list[tuple[str, Path, bool]]:
        """(label, trusted package source, needs torch headers) of the fixed layer."""
        sources = [(BINDING_LABEL, TEMPLATES / "common" / "binding.cpp", True)]
        if chain.device == "cuda":
            sources.append((TIMER_LABEL, TIMER_SOURCE, False))
        return sources

    def _fixed_object(self, chain: Toolchain, source: Path, heavy: bool
                      ) -> tuple[bool, str | None, Path]:
        """Compile one fixed-layer source once per toolchain; the log is None on a cache hit."""
        cmd = self._command(chain, str(source), "OUT", heavy=heavy)
        key = _hash(FIXED_LAYER_VERSION, chain.fingerprint, " ".join(cmd), source.read_bytes(),
                    (TEMPLATES / "common" / "binding_registry.h").read_bytes())
        obj = self._object_path(key)
        if obj.exists():
            return True, None, obj
        with _locked(obj.with_suffix(".lock")):
            if obj.exists():
                return True, None, obj
            ok, log = self._compile(cmd, source.parent, obj)
        return ok, log, obj


def _refused_calls(chain: Toolchain, units: list[tuple[str, str, Path, str]], cache: Path
                   ) -> tuple[Diagnostic, ...]:
    """What the kernel objects call that a workspace may not (``symbols``): PyTorch, Python,
    dynamic lookup, other libraries' arithmetic; one error per source and symbol."""
    try:
        problems = symbols.check_objects([(u[0], u[2]) for u in units],
                                         symbols.workspace_policy(chain.cxx, cache))
    except symbols.SymbolToolError as exc:
        return (Diagnostic(None, None, None, "error", f"symbol check: {exc}"),)
    return tuple(Diagnostic(p.where, None, None, "error", _cut(
        f"{p.verb} {p.symbol} ({p.rule}): not allowed")) for p in problems
        )[:diagnostics.MAX_DIAGNOSTICS]


def _lto_refusal(obj: Path, source: Path) -> str:
    """An error for a kernel object carrying link-time-optimisation sections, else ''."""
    try:
        found = sources.lto_sections(obj)
    except (OSError, ValueError, IndexError) as exc:
        return f"{source}: error: its object cannot be read: {exc}\n"
    if found:
        return (f"{source}: error: its object carries link-time-optimisation sections "
                f"({', '.join(sorted(set(found))[:3])}): not allowed\n")
    return ""


def _flag_paths(flags: list[str]) -> list[str]:
    """The folders and files the configured flags name (``-I``, ``-isystem DIR``...), which
    a confined compile must see."""
    out = []
    for i, flag in enumerate(flags):
        for prefix in ("-I", "-isystem", "-iquote", "-idirafter", "-include", "-L"):
            if flag == prefix and i + 1 < len(flags):
                out.append(flags[i + 1])
            elif flag.startswith(prefix) and flag != prefix:
                out.append(flag[len(prefix):].lstrip("="))
    return out


def _cut(message: str) -> str:
    limit = diagnostics.MAX_MESSAGE
    return message if len(message) <= limit else message[:limit - 3] + "..."


def _hash(*parts: str | bytes) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part if isinstance(part, bytes) else part.encode())
        digest.update(b"\0")
    return digest.hexdigest()


@contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def load_extension(path: str | Path):
    """Import a built ``cuda_extension`` module from its file and register it by name. The
    fixed library beside it is loaded first, so that its symbols are bound before the
    module's own could stand in for them."""
    import ctypes
    import importlib.util
    import sys

    import torch  # noqa: F401  (loads libtorch before the extension)

    for library in sorted(Path(path).parent.glob(f"{link.FIXED_PREFIX}*.so")):
        ctypes.CDLL(str(library), mode=os.RTLD_LOCAL | os.RTLD_NOW)
    spec = importlib.util.spec_from_file_location(MODULE_NAME, str(path))
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load extension from {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[MODULE_NAME] = module
    return module
