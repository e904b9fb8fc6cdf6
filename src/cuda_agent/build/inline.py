"""Build a single-file candidate's ``load_inline`` extension judge-side, through the same
content-addressed cache as a workspace's kernels.

A ``load_inline`` (or ``load``) call in the candidate's process reaches the judge as a
request (``InlineRequest``): the module's name, its source files as torch would write them
(``main.cpp``: ``torch/extension.h``, the C++ sources and the generated bindings;
``cuda.cu``: the CUDA sources), and the candidate's own flags. The judge compiles each file
with its own toolchain (``Toolchain``: compilers, torch, the device's architecture) and
flags (torch's for an extension, the candidate's as far as ``inline_flags`` allows), each
to an object cached under a key of the toolchain, the command and the file's text; links
them with torch's libraries into ``NAME.so`` under a key of the objects, the link command
and the symbol policy; checks what the module calls (``symbols``, the single-file policy)
before it is placed; and records that check beside it. So an unchanged source is never
compiled again (another judgement, another candidate process, another judge: each reads
the cache), a changed ``cuda.cu`` recompiles only itself, and the cache is written by the
judge alone: the candidate's process, confined read-only, loads the module from it.

    module = InlineBuilder(builder, symbols.single_file_policy(ALLOWED)).build(request)
"""

from __future__ import annotations

import functools
import json
import os
import re
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cuda_agent.build import diagnostics, inline_flags, nvcc_split, symbols
from cuda_agent.build.builder import Builder, _hash, _locked
from cuda_agent.build.toolchain import Toolchain, ToolchainError
from cuda_agent.results import BuildResult, Diagnostic

INLINE_VERSION = "1"
"""Enters every key of this module's objects and modules; bump when how they build changes."""
MAX_UNITS = 16
MAX_SOURCE_BYTES = 8 * 1024 * 1024
NAME = re.compile(r"[A-Za-z_]\w{0,99}")
FILE = re.compile(r"[A-Za-z0-9_][\w.-]{0,99}\.(?:cpp|cc|cxx|cu)")
NVCC_COMMON = ("-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
               "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__",
               "--expt-relaxed-constexpr")
"""torch's own flags for an extension's CUDA files."""


Refusals = tuple[tuple[str, str], ...]


class RequestError(ValueError):
    """A request the judge does not build (its shape, or a flag ``inline_flags`` refuses)."""


@dataclass(frozen=True)
class Unit:
    """One source file of the extension."""

    file: str
    text: str

    @property
    def cuda(self) -> bool:
        return self.file.endswith(".cu")


@dataclass(frozen=True)
class InlineRequest:
    """What a ``load_inline`` call asks the judge to build, validated."""

    name: str
    units: tuple[Unit, ...]
    cflags: tuple[str, ...] = ()
    cuda_cflags: tuple[str, ...] = ()
    ldflags: tuple[str, ...] = ()
    with_cuda: bool = False

    @classmethod
    def parse(cls, data: Any) -> InlineRequest:
        """From the candidate's message (anything: every field is checked)."""
        if not isinstance(data, dict):
            raise RequestError("a build request must be an object")
        name = data.get("name")
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise RequestError("name: a Python identifier of at most 100 characters")
        units = _units(data.get("units"))
        with_cuda = data.get("with_cuda")
        with_cuda = any(u.cuda for u in units) if with_cuda is None else with_cuda
        if not isinstance(with_cuda, bool):
            raise RequestError("with_cuda: true, false or null")
        paths = _strings(data.get("include_paths"), "extra_include_paths")
        if any(p.strip() for p in paths):
            raise RequestError("extra_include_paths: the judge compiles a single-file "
                               "candidate with torch's and CUDA's headers only")
        try:
            return cls(name, units,
                       tuple(inline_flags.cxx_flags(_strings(data.get("cflags"),
                                                             "extra_cflags"))),
                       tuple(inline_flags.nvcc_flags(_strings(data.get("cuda_cflags"),
                                                              "extra_cuda_cflags"))),
                       tuple(inline_flags.ld_flags(_strings(data.get("ldflags"),
                                                            "extra_ldflags"), with_cuda)),
                       with_cuda)
        except inline_flags.FlagError as exc:
            raise RequestError(str(exc)) from None


def _units(value: Any) -> tuple[Unit, ...]:
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_UNITS:
        raise RequestError(f"units: 1 to {MAX_UNITS} source files")
    units, total = [], 0
    for item in value:
        file, text = (item.get("file"), item.get("text")) if isinstance(item, dict) else (0, 0)
        if not isinstance(file, str) or not FILE.fullmatch(file) or not isinstance(text, str):
            raise RequestError("units: each a file name (*.cpp, *.cc, *.cxx, *.cu, no folder) "
                               "and its text")
        total += len(text.encode(errors="surrogatepass"))
        if total > MAX_SOURCE_BYTES:
            raise RequestError(f"sources exceed {MAX_SOURCE_BYTES >> 20} MiB")
        units.append(Unit(file, text))
    if len({u.file for u in units}) != len(units):
        raise RequestError("units: two source files of the same name")
    return tuple(units)


def _strings(value: Any, what: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value) or \
            len(value) > inline_flags.MAX_FLAGS:
        raise RequestError(f"{what}: a list of at most {inline_flags.MAX_FLAGS} strings")
    return value


@dataclass(frozen=True)
class InlineBuild:
    """One request's build: the module's path when it may be loaded."""

    ok: bool
    path: Path | None
    compiled: tuple[str, ...] = ()
    cached: tuple[str, ...] = ()
    log: str = ""
    seconds: float = 0.0
    refused: tuple[tuple[str, str], ...] = ()
    """(where, why) of each refusal: a call the module makes that a single-file candidate
    may not (``symbols``), or a request the judge does not build."""

    def result(self, device: str) -> BuildResult:
        """As the verdict reports a build."""
        found = (*(Diagnostic(where, None, None, "error", diagnostics._trim(why))
                   for where, why in self.refused), *diagnostics.parse(self.log))
        if not self.ok and not any(d.severity in ("error", "fatal error") for d in found):
            found = (Diagnostic(None, None, None, "error", "build failed; see log"), *found)
        return BuildResult(self.ok, device, str(self.path) if self.path else None, found,
                           self.compiled, self.cached, self.seconds,
                           diagnostics.trim_log(self.log))


class InlineBuilder:
    """Builds requests with ``builder``'s toolchain, flags and cache; refuses a module that
    ``policy`` refuses. Safe to share between threads and processes."""

    def __init__(self, builder: Builder, policy: symbols.Policy):
        self.builder, self.policy = builder, policy
        self.policy_key = _policy_key(policy)

    def build(self, request: InlineRequest) -> InlineBuild:
        """Never raises on the candidate's code: a failure is an ``InlineBuild`` that says
        why (a missing tool of the judge's raises ``ToolchainError``)."""
        start = time.perf_counter()
        chain = self.builder.chain
        if request.with_cuda and chain.device != "cuda":
            return InlineBuild(False, None, refused=((
                "load_inline", "CUDA sources need the judge's --device cuda; the CPU target "
                "builds cpp_sources with g++"),))
        with ThreadPoolExecutor(max_workers=len(request.units)) as pool:
            units = list(pool.map(lambda u: self._unit(chain, request, u), request.units))
        compiled = tuple(u[0] for u in units if u[1] == "compiled")
        cached = tuple(u[0] for u in units if u[1] == "cached")
        log = "\n".join(u[3] for u in units if u[3])
        if any(u[1] == "failed" for u in units):
            return InlineBuild(False, None, compiled, cached, log, time.perf_counter() - start)
        path, link_log, refused = self._module(chain, request, [u[2] for u in units])
        return InlineBuild(path is not None, path, compiled, cached,
                           "\n".join(x for x in (log, link_log) if x),
                           time.perf_counter() - start, refused)

    def command(self, chain: Toolchain, request: InlineRequest, unit: Unit) -> list[str]:
        """The judge's command for one file (torch's extension flags, then the candidate's
        allowed ones, then the judge's configured extras); its output is ``OUT``."""
        config = self.builder.config
        includes = [*chain.torch_includes,
                    *([str(Path(chain.cuda_home) / "include")]
                      if request.with_cuda and chain.cuda_home else []),
                    chain.python_include]
        common = [f"-DTORCH_EXTENSION_NAME={request.name}", "-DTORCH_API_INCLUDE_EXTENSION_H",
                  f"-D_GLIBCXX_USE_CXX11_ABI={chain.cxx11_abi}",
                  *(word for path in includes for word in ("-isystem", path))]
        if not unit.cuda:
            return [chain.cxx, *common, "-fPIC", f"-std={torch_std(chain.torch_dir)}",
                    *request.cflags, *config.extra_cflags, "-c", unit.file, "-o", "OUT"]
        if chain.nvcc is None or chain.arch is None:
            raise ToolchainError("the CUDA toolchain has no nvcc or architecture")
        std = [] if any(f.lstrip("-").startswith("std") for f in request.cuda_cflags) else \
            [f"-std={torch_std(chain.torch_dir)}"]
        return [chain.nvcc, *common, *NVCC_COMMON,
                f"-gencode=arch=compute_{chain.arch},code=sm_{chain.arch}",
                "-Xcompiler", "-fPIC", *request.cuda_cflags, *std, *config.extra_cuda_cflags,
                "-c", unit.file, "-o", "OUT"]

    def _unit(self, chain: Toolchain, request: InlineRequest, unit: Unit
              ) -> tuple[str, str, Path, str]:
        """(file, 'compiled' | 'cached' | 'failed', object, log): compiled once per key,
        whoever asks at the same time (the others wait for it)."""
        cmd = self.command(chain, request, unit)
        split = self.builder.config.split_nvcc and unit.cuda
        command = " ".join(cmd) + (f" {nvcc_split.CACHE_MARKER}" if split else "")
        obj = self.builder._object_path(_hash("inline", INLINE_VERSION, chain.fingerprint,
                                              command, unit.text))
        if obj.exists():
            return unit.file, "cached", obj, ""
        with _locked(obj.with_suffix(".lock")):
            if obj.exists():
                return unit.file, "cached", obj, ""
            with tempfile.TemporaryDirectory(prefix="cuda-agent-inline-") as folder:
                (Path(folder) / unit.file).write_text(unit.text, errors="surrogatepass")
                ok, log = self.builder._compile(cmd, Path(folder), obj, split)
        return unit.file, "compiled" if ok else "failed", obj, log

    def _module(self, chain: Toolchain, request: InlineRequest, objects: list[Path]
                ) -> tuple[Path | None, str, Refusals]:
        """The objects linked into ``NAME.so`` and checked, once per key: (path, log,
        refusals); a refused module is never placed, its refusals are kept."""
        cuda = request.with_cuda
        libs = [f"-L{chain.torch_lib}", "-lc10", *(["-lc10_cuda"] if cuda else []),
                "-ltorch_cpu", *(["-ltorch_cuda"] if cuda else []), "-ltorch",
                "-ltorch_python"]
        if cuda:
            libs += [f"-L{Path(chain.cuda_home or '') / 'lib64'}", "-lcudart"]
        cmd = [chain.cxx, *map(str, objects), "-shared", *libs, *request.ldflags, "-o", "OUT"]
        key = _hash("inline-module", INLINE_VERSION, chain.fingerprint, " ".join(cmd),
                    self.policy_key)
        folder = self.builder.cache / "inline" / key[:32]
        module, record = folder / f"{request.name}.so", folder / "check.json"
        found = _recorded(record, module)
        if found is not None:
            return found
        folder.mkdir(parents=True, exist_ok=True)
        with _locked(folder / ".lock"):
            found = _recorded(record, module)
            if found is not None:
                return found
            staging = folder / f".{request.name}.{os.getpid()}.{time.monotonic_ns()}.so"
            ok, log = self.builder._compile(cmd, self.builder.cache, staging)
            if not ok:
                staging.unlink(missing_ok=True)
                return None, log, ()
            try:
                refused = tuple((p.where, f"{p.verb} {p.symbol} ({p.rule}): not allowed")
                                for p in symbols.check_file(staging, self.policy,
                                                            f"{request.name}.so"))
            except symbols.SymbolToolError as exc:  # the judge's machine, not the candidate
                staging.unlink(missing_ok=True)
                raise ToolchainError(f"symbol check: {exc}") from None
            _write(record, json.dumps({"refused": list(refused)}))
            if refused:
                staging.unlink(missing_ok=True)
                return None, "", refused
            os.replace(staging, module)
            return module, log, ()


def _recorded(record: Path, module: Path) -> tuple[Path | None, str, Refusals] | None:
    """What an earlier build of this key left: the module, or its refusals; None if none."""
    try:
        refused = tuple((str(where), str(why)) for where, why
                        in json.loads(record.read_text())["refused"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if refused:
        return None, "", refused
    return (module, "", ()) if module.is_file() else None


def _write(path: Path, text: str) -> None:
    staging = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    staging.write_text(text)
    os.replace(staging, path)


def _policy_key(policy: symbols.Policy) -> str:
    """The policy and the code that applies it: a module checked under other rules is
    checked again (it is linked under another key)."""
    here = Path(symbols.__file__).parent
    return _hash(policy.kind, "\n".join(sorted(policy.allowed_ops)),
                 *((here / name).read_bytes() for name in
                   ("symbols.py", "symbol_rules.py", "callers.py")))


@functools.cache
def torch_std(torch_dir: str) -> str:
    """The C++ standard torch builds its extensions with (``-std=c++17`` before torch moved
    to C++20), read from torch's own build helper."""
    try:
        text = (Path(torch_dir) / "utils" / "cpp_extension.py").read_text()
    except OSError:
        return "c++17"
    return "c++20" if "'-std=c++20'" in text else "c++17"
