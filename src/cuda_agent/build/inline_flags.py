"""Which of a single-file candidate's own compiler flags the judge compiles with.

A ``load_inline`` call names flags of its own (``extra_cflags=["-O3"]``,
``extra_cuda_cflags=["--use_fast_math"]``, ``extra_ldflags=["-lcublas"]``). The judge runs
the compilers itself, outside the candidate's confinement, so a flag may change how the code
is optimised and which warnings it gets, never which programs run, which files are read or
written, or what is linked beyond the libraries a candidate may call: plugins, wrappers,
other compilers, include and library folders, dump and profile files, response files and
linker options are refused, each with the flag named. Each string is split as a shell would
(``"-Xptxas -O3"`` is two words, as in torch's build file) but never run by one. The
architecture is the judge's (the device's): a candidate's ``-arch``/``-gencode`` is dropped.

    kept = cxx_flags(["-O3", "-fopenmp"])         # raises FlagError on a refused flag
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable

MAX_FLAGS = 64
MAX_FLAG_CHARS = 256

_VALUE = r"[\w.,+-]*"  # no '/', no '@': a value never names a file elsewhere
_CXX = re.compile("|".join((
    r"-O[0-3sgz]?", r"-Ofast", r"-g[0-3]?", r"-ggdb[0-3]?", r"-std=(?:c|gnu)\+\+\w+",
    r"-D[A-Za-z_]\w*(?:=.*)?", r"-U[A-Za-z_]\w*", r"-m[a-z0-9][\w.+-]*(?:=" + _VALUE + ")?",
    r"-f(?:no-)?[a-z0-9][a-z0-9-]*(?:=" + _VALUE + ")?",
    r"-W(?:no-)?[a-z0-9][\w+-]*(?:=[\w.+-]*)?", r"-w", r"-pedantic(?:-errors)?",
    r"-pthread", r"-fPIC", r"-fpic")))
_CXX_REFUSED = re.compile(
    r"-f(?:no-)?(?:plugin|dump|profile|auto-profile|save-|opt-info|stack-usage|callgraph-info|"
    r"compare-debug|coverage|test-coverage|branch-probabilities|create-profile|lto|use-ld|"
    r"sanitize|instrument|diagnostics-(?:add|set)-output|record-gcc|pch|self-test|"
    r"debug-prefix|file-prefix|macro-prefix|profile-prefix|ident|working-directory)")
"""``-f`` flags that load code, write files of their own or change what the object says
about the machine that built it."""

_NVCC_WORD = re.compile("|".join((
    r"-O[0-3]", r"--?use_fast_math", r"--?(?:ftz|prec-div|prec-sqrt|fmad)=(?:true|false)",
    r"-lineinfo", r"--generate-line-info", r"-g", r"-G", r"--device-debug", r"--debug",
    r"--?expt-relaxed-constexpr", r"--?expt-extended-lambda", r"--?extended-lambda",
    r"--?std=c\+\+\w+", r"-D[A-Za-z_]\w*(?:=.*)?", r"-U[A-Za-z_]\w*",
    r"--?maxrregcount=\d+", r"--?restrict", r"-res-usage", r"--resource-usage",
    r"-Wno-deprecated-gpu-targets", r"-Wno-deprecated-declarations", r"-w",
    r"--?diag[-_]suppress=[\d,]+", r"--display-error-number", r"--?threads=\d+",
    r"--?default-stream=(?:legacy|per-thread|null)")))
_PTXAS = re.compile(r"-O[0-3]|-v|--verbose|--?warn-on-spills|--?warn-on-local-memory-usage|"
                    r"-dlcm=c[ags]|-dscm=(?:cg|cs|wt|wb)|--?maxrregcount=\d+|"
                    r"--allow-expensive-optimizations(?:=(?:true|false))?")
_CUDAFE = re.compile(r"--?diag[-_]suppress=[\w,]+|--display_error_number")
_ARCH = re.compile(r"(?:-arch|--gpu-architecture|-gencode|--generate-code|-code|--gpu-code)"
                   r"(?:=.*)?")
_WITH_VALUE = {"-Xptxas": _PTXAS, "--ptxas-options": _PTXAS, "-Xcudafe": _CUDAFE,
               "-Xcompiler": None, "--compiler-options": None}
"""nvcc options whose value (the next word, or after '=') is a comma-separated list of the
given tool's flags (None: the host compiler's, ``cxx_flags``)."""
_PAIRED = {"-t": re.compile(r"\d+"), "--threads": re.compile(r"\d+"),
           "-maxrregcount": re.compile(r"\d+"), "--maxrregcount": re.compile(r"\d+"),
           "-std": re.compile(r"c\+\+\w+"), "--std": re.compile(r"c\+\+\w+")}

CUDA_LIBRARIES = ("cublas", "cublasLt", "cudnn", "cuda", "cudart")
HOST_LIBRARIES = ("gomp", "m", "pthread", "stdc++", "c10", "torch", "torch_cpu",
                  "torch_python")
_LD = re.compile(r"-fopenmp|-pthread|-O[0-3]?|-shared|-s|-Wl,--(?:no-)?as-needed")


class FlagError(ValueError):
    """A flag the judge does not compile with."""


def words(flags: Iterable[str], what: str) -> list[str]:
    """The words of ``flags`` (empty strings dropped), each string split as a shell would."""
    found: list[str] = []
    for flag in flags:
        if not isinstance(flag, str) or len(flag) > MAX_FLAG_CHARS:
            raise FlagError(f"{what}: each flag must be a string of at most {MAX_FLAG_CHARS} "
                            "characters")
        try:
            found += shlex.split(flag)
        except ValueError as exc:
            raise FlagError(f"{what}: {flag!r} cannot be split into words ({exc})") from None
    if len(found) > MAX_FLAGS:
        raise FlagError(f"{what}: at most {MAX_FLAGS} flags")
    return found


def cxx_flags(flags: Iterable[str], what: str = "extra_cflags") -> list[str]:
    """The host compiler's flags, as given, once each is known to be allowed."""
    kept = words(flags, what)
    for word in kept:
        _cxx_word(word, what)
    return kept


def _cxx_word(word: str, what: str) -> None:
    if not _CXX.fullmatch(word) or _CXX_REFUSED.match(word):
        raise FlagError(f"{what}: {word!r} is not a flag the judge compiles with (it takes "
                        "optimisation, -std, -D/-U, -m and -f code generation and warning "
                        "flags; none that loads a plugin, reads or writes a file or passes "
                        "options to the linker)")


def nvcc_flags(flags: Iterable[str], what: str = "extra_cuda_cflags") -> list[str]:
    """nvcc's flags, the candidate's architecture options dropped (the judge's target is
    the device's)."""
    given, kept, k = words(flags, what), [], 0
    while k < len(given):
        word = given[k]
        name, eq, value = word.partition("=")
        if _ARCH.fullmatch(word):
            k += 1 if eq or word.startswith("-gencode=") else 2  # and its value
            continue
        if name in _WITH_VALUE or name in _PAIRED:
            if not eq:
                if k + 1 >= len(given):
                    raise FlagError(f"{what}: {word!r} needs a value")
                k, value = k + 1, given[k + 1]
            _value(name, value, what)
            kept += [word] if eq else [name, value]
        elif _NVCC_WORD.fullmatch(word):
            kept.append(word)
        else:
            raise FlagError(f"{what}: {word!r} is not a flag the judge compiles CUDA with (it "
                            "takes optimisation, -std, -D/-U, fast-math, line info, register "
                            "limits, -Xptxas and -Xcompiler with allowed flags; none that "
                            "names a file, a folder, another compiler or relocatable code)")
        k += 1
    return kept


def _value(name: str, value: str, what: str) -> None:
    if name in _PAIRED:
        if not _PAIRED[name].fullmatch(value):
            raise FlagError(f"{what}: {name} {value!r} is not allowed")
        return
    check = _WITH_VALUE[name]
    for part in value.split(","):
        if check is None:
            _cxx_word(part, f"{what} ({name})")
        elif not check.fullmatch(part):
            raise FlagError(f"{what}: {name} {part!r} is not a flag the judge passes on")


def ld_flags(flags: Iterable[str], cuda: bool, what: str = "extra_ldflags") -> list[str]:
    """Libraries a candidate may link (cuBLAS, cuDNN, the CUDA runtime and driver on CUDA;
    OpenMP and the C/C++ runtime everywhere): the symbol check decides what they may be
    called for. No library folder, no linker option."""
    kept = words(flags, what)
    allowed = HOST_LIBRARIES + (CUDA_LIBRARIES if cuda else ())
    for word in kept:
        if word.startswith("-l") and word[2:] in allowed or _LD.fullmatch(word):
            continue
        raise FlagError(f"{what}: {word!r} is not linked by the judge (libraries: "
                        f"{', '.join('-l' + name for name in allowed)}; no -L, -Wl or "
                        "other linker options)")
    return kept
