"""The symbol check (invariant 4): objects compiled here with g++ and nvcc (compile-only),
a shared object built by ``load_inline``, and workspaces built by the builder; what each
may call.

    pytest -q -p no:cacheprovider tests/build/test_symbols.py
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from cuda_agent.build import BuildConfig, Builder, symbol_rules, symbols
from cuda_agent.build.symbols import Symbol, SymbolToolError
from cuda_agent.judge.guard import ALLOWED
from cuda_agent.paths import TEMPLATES
from tests.build.symbol_sources import (
    CUBLAS,
    CUDA_INLINE,
    CUDA_INLINE_DECLARATIONS,
    CUDA_LIBRARIES,
    INLINE,
    LIBRARIES,
    LOOKUP,
    OWN_DLSYM,
    RAW_SYSCALL,
    RUNTIME,
    STATIC_GUARD,
    SYSCALL_ADDRESS,
    TORCH_CALLS,
    UNKNOWN,
    WEAK_MM,
)
from tests.conftest import SCALE_ADD_BINDING, SCALE_ADD_KERNEL, write_solution
from tests.judge.adversarial import kernels

REPO = Path(__file__).resolve().parents[2]

GXX_SOURCES = {
    "kernels/scale_add.cpp": SCALE_ADD_KERNEL,
    "kernels/scale_add_binding.cpp": SCALE_ADD_BINDING,
    "kernels/runtime.cpp": RUNTIME,
    "kernels/torch_binding.cpp": TORCH_CALLS,
    "kernels/lookup.cpp": LOOKUP,
    "kernels/own_dlsym.cpp": OWN_DLSYM,
    "kernels/libraries.cpp": LIBRARIES,
    "kernels/unknown.cpp": UNKNOWN,
    "kernels/pyrun_binding.cpp": kernels.PYRUN,
}
NVCC_SOURCES = {"kernels/gemm.cu": CUBLAS, "kernels/spectral.cu": CUDA_LIBRARIES}


def _compile(folder: Path, name: str, text: str) -> Path:
    source = folder / name
    source.parent.mkdir(parents=True, exist_ok=True)
    source.write_text(text)
    obj = source.with_suffix(".o")
    if source.suffix == ".cu":
        cmd = ["nvcc", "-O2", "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a",
               "-Xcompiler", "-fPIC", "-c", str(source), "-o", str(obj)]
    else:
        cmd = ["g++", "-O2", "-march=native", "-fopenmp", "-std=c++17", "-fPIC",
               f"-I{TEMPLATES / 'common'}", "-c", str(source), "-o", str(obj)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return obj


def _compile_all(folder: Path, sources: dict[str, str]) -> dict[str, Path]:
    with ThreadPoolExecutor(2) as pool:
        paths = pool.map(lambda item: _compile(folder, *item), sources.items())
        return dict(zip(sources, paths, strict=True))


@pytest.fixture(scope="module")
def objects(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return _compile_all(tmp_path_factory.mktemp("gxx"), GXX_SOURCES)


@pytest.fixture(scope="module")
def policy() -> symbols.Policy:
    return symbols.workspace_policy("g++")


def _found(problems: list[symbols.Problem]) -> dict[tuple[str, str], str]:
    """(where, symbol without its parameters) -> rule."""
    return {(p.where, p.symbol.split("(")[0]): p.rule for p in problems}


def test_honest_kernels_pass(objects: dict[str, Path], policy: symbols.Policy):
    honest = ["kernels/scale_add.cpp", "kernels/scale_add_binding.cpp", "kernels/runtime.cpp"]
    assert symbols.check_objects([(name, objects[name]) for name in honest], policy) == []


def test_a_weak_reference_to_an_unknown_name_is_refused(objects: dict[str, Path],
                                                        policy: symbols.Policy):
    """A strong reference that nothing defines is the link's to name (``undefined symbol``);
    a weak one links, so the check names it."""
    (problem,) = symbols.check_objects([("k.cpp", objects["kernels/unknown.cpp"])], policy)
    assert str(problem) == ("k.cpp calls fast_gemm (not the fixed layer, the C/C++ runtime, "
                            "OpenMP, the CUDA runtime, cuBLAS or cuDNN): not allowed")


def test_pytorch_in_a_workspace_kernel_is_refused(objects: dict[str, Path],
                                                  policy: symbols.Policy):
    where = "kernels/torch_binding.cpp"
    problems = symbols.check_objects([(where, objects[where])], policy)
    assert str(problems[0]).startswith(f"{where} calls ")
    found = _found(problems)
    arithmetic = ["at::_ops::add_Tensor::call", "at::_ops::add_Tensor::redispatch",
                  "at::_ops::empty_like::call", "at::_ops::mm::call", "at::native::mm",
                  "at::cpu::mm"]
    for symbol in arithmetic:
        assert found[(where, symbol)] == "PyTorch arithmetic", symbol
    for symbol in ("at::cuda::getCurrentCUDABlasHandle", "at::clearCallbacks",
                   "c10::detail::torchCheckFail", "c10::Dispatcher::findSchemaOrThrow"):
        assert found[(where, symbol)].startswith("PyTorch, which workspace kernels"), symbol
    assert found[(where, "PyRun_SimpleString")].startswith("the Python C API")
    assert "calls at::_ops::add_Tensor::call(at::Tensor const&, at::Tensor const&, double) " \
        "(PyTorch arithmetic): not allowed" in "\n".join(map(str, problems))


def test_dynamic_lookup_and_other_processes_are_refused(objects: dict[str, Path],
                                                        policy: symbols.Policy):
    problems = symbols.check_objects([(name, objects[name]) for name in
                                      ("kernels/lookup.cpp", "kernels/own_dlsym.cpp")], policy)
    found = _found(problems)
    assert {symbol for where, symbol in found if where == "kernels/lookup.cpp"} == {
        "dlopen", "dlsym", "dl_iterate_phdr", "mprotect", "popen", "cudaGetDriverEntryPoint",
        "syscall"}
    assert found[("kernels/lookup.cpp", "dlsym")] == symbol_rules.LOOKUP
    assert "memory protection" in found[("kernels/lookup.cpp", "mprotect")]
    assert "processes" in found[("kernels/lookup.cpp", "syscall")]
    assert not any(where == "kernels/own_dlsym.cpp" for where, _ in found)


def test_python_and_other_libraries_arithmetic_are_refused(objects: dict[str, Path],
                                                           policy: symbols.Policy):
    found = _found(symbols.check_objects([(name, objects[name]) for name in (
        "kernels/libraries.cpp", "kernels/pyrun_binding.cpp")], policy))
    assert found[("kernels/libraries.cpp", "cblas_sgemm")] == "another library's arithmetic: BLAS"
    assert found[("kernels/libraries.cpp", "sgemm_")] == "another library's arithmetic: BLAS"
    assert found[("kernels/libraries.cpp", "LAPACKE_sgesv")].endswith("LAPACK")
    assert found[("kernels/pyrun_binding.cpp", "PyRun_SimpleString")].startswith(
        "the Python C API")


@pytest.mark.nvcc
def test_cublas_is_allowed_other_cuda_libraries_are_not(tmp_path: Path,
                                                        policy: symbols.Policy):
    objs = _compile_all(tmp_path, NVCC_SOURCES)
    assert symbols.check_objects([("kernels/gemm.cu", objs["kernels/gemm.cu"])], policy) == []
    found = _found(symbols.check_objects([("kernels/spectral.cu",
                                           objs["kernels/spectral.cu"])], policy))
    assert {rule for (_, symbol), rule in found.items()} == {
        "another library's arithmetic: cuFFT", "another library's arithmetic: cuSPARSE",
        "another library's arithmetic: the cuRAND host API"}


def test_the_runtime_passes_but_for_the_named_routes(policy: symbols.Policy):
    """Every name libc, libm, libstdc++, libgcc and libgomp define passes a workspace, but
    for the dynamic-lookup, process and memory-protection names."""
    refused = {name for name in policy.runtime
               if symbol_rules.workspace(name, name, False, policy.runtime, False)}
    assert {"dlopen", "dlsym", "syscall", "mprotect", "fork", "system", "_r_debug"} <= refused
    assert all(name in symbol_rules.INTERPOSABLE or name.startswith("_dl_")
               for name in refused), sorted(refused)
    for name in ("memcpy", "expf", "pthread_create", "mmap", "__cxa_throw", "atexit",
                 "GOMP_parallel", "__tls_get_addr", "__cpu_model"):
        assert name in policy.runtime and name not in refused, name


def test_other_libraries_arithmetic_is_refused_under_every_name_they_export():
    """libtorch carries MKL (``sgemm``, ``SGEMM`` beside ``sgemm_``), FBGEMM, SLEEF and
    XNNPACK; a name of theirs is refused whatever its spelling, in both policies, and a
    single file may not import Python modules from native code."""
    names = [("sgemm", "sgemm"), ("SGEMM", "SGEMM"), ("sgemm_", "sgemm_"), ("SDOT", "SDOT"),
             ("cgemm", "cgemm"), ("dgemv_64", "dgemv_64"), ("cblas_sgemm", "cblas_sgemm"),
             ("_ZN6fbgemm15cblas_sgemm_refEv", "fbgemm::cblas_sgemm_ref()"),
             ("_ZN4dnnl4impl3fooEv", "dnnl::impl::foo()"),
             ("Sleef_expf8_u10", "Sleef_expf8_u10"), ("xnn_run_operator", "xnn_run_operator")]
    for name, plain in names:
        assert symbol_rules.single_file(name, plain, frozenset()), name
        assert symbol_rules.workspace(name, plain, False, frozenset(), True), name
    assert symbol_rules.single_file("PyImport_ImportModule", "PyImport_ImportModule",
                                    frozenset()).startswith("imports Python modules")
    for name in ("memcpy", "expf", "PyObject_GetAttrString", "PyEval_GetBuiltins", "sincosf"):
        assert symbol_rules.single_file(name, name, frozenset()) is None, name


def test_single_file_rules(objects: dict[str, Path]):
    """A load_inline module may call torch's creation, views, copies and fills and its
    infrastructure; not its arithmetic, redispatch, per-backend kernels or the routes
    around the trace."""
    where = "kernels/torch_binding.cpp"
    found = _found(symbols.check_file(objects[where], symbols.single_file_policy(ALLOWED),
                                      "ext.so"))
    assert found == {
        ("ext.so", "at::_ops::add_Tensor::call"): "PyTorch arithmetic",
        ("ext.so", "at::_ops::add_Tensor::redispatch"):
            "PyTorch redispatch, which skips the operator trace",
        ("ext.so", "at::_ops::mm::call"): "PyTorch arithmetic",
        ("ext.so", "at::native::mm"): "PyTorch arithmetic outside the dispatcher",
        ("ext.so", "at::cpu::mm"): "PyTorch arithmetic outside the dispatcher",
        ("ext.so", "at::cuda::getCurrentCUDASparseHandle"):
            "another library's arithmetic: cuSOLVER or cuSPARSE",
        ("ext.so", "at::clearCallbacks"): "switches off the judge's operator trace",
        ("ext.so", "c10::Dispatcher::findSchemaOrThrow"):
            "looks up PyTorch operators by name, which this check cannot follow",
        ("ext.so", "PyRun_SimpleString"): "runs Python code or tracing from native code",
    }  # empty_like, fill_, getCurrentCUDABlasHandle, torchCheckFail, PyObject_* pass


def test_operator_names_come_from_the_schemas():
    names = symbol_rules.operator_names()
    assert names["add_Tensor"] == "add" and names["fill__Scalar"] == "fill_"
    assert names["empty_memory_format"] == "empty" and names["mm"] == "mm"
    plain = "at::_ops::{}::call(at::Tensor const&)"
    policy = symbols.single_file_policy(ALLOWED)
    assert policy.refusal(Symbol("x", plain.format("no_such_op"))) == \
        "an operator this torch does not know"
    assert policy.refusal(Symbol("x", plain.format("zero_"))) is None  # a fill


def test_a_shared_object_defining_a_refused_name_is_refused(tmp_path: Path):
    """Its calls to its own ``dlsym`` bind to the C library's, loaded first."""
    source = tmp_path / "own.cpp"
    source.write_text(OWN_DLSYM + 'extern "C" void* find(void* h) { return dlsym(h, "x"); }\n')
    nested = tmp_path / "tree" / "inline" / "own.so"
    nested.parent.mkdir(parents=True)
    subprocess.run(["g++", "-shared", "-fPIC", str(source), "-o", str(nested)], check=True)
    (problem,) = symbols.check_tree(tmp_path / "tree", symbols.single_file_policy(ALLOWED))
    assert str(problem).startswith("inline/own.so defines dlsym (dynamic loading")
    assert symbols.check_tree(tmp_path / "missing", symbols.single_file_policy(ALLOWED)) == []


def test_the_runtimes_own_calls_in_a_shared_object_pass(tmp_path: Path):
    """A toolchain that links part of libstdc++ into an extension brings its syscall (the
    static guard's futex): the runtime's call passes, the candidate's does not."""
    policy = symbols.single_file_policy(ALLOWED)
    found = {}
    for name, text in {"guard": STATIC_GUARD, "raw": STATIC_GUARD + RAW_SYSCALL,
                       "address": STATIC_GUARD + SYSCALL_ADDRESS}.items():
        source, library = tmp_path / f"{name}.cpp", tmp_path / f"{name}.so"
        source.write_text(text)
        subprocess.run(["g++", "-O2", "-shared", "-fPIC", str(source), "-o", str(library)],
                       check=True)
        found[name] = [str(p) for p in symbols.check_file(library, policy, name)]
    refused = "calls syscall (raw system calls, other processes or programs): not allowed"
    assert found == {"guard": [], "raw": [f"raw {refused}"], "address": [f"address {refused}"]}


def test_what_a_live_process_loaded_is_checked(tmp_path: Path):
    """Read from the process's own view of its files, whatever it says it loaded."""
    source, library = tmp_path / "find.cpp", tmp_path / "loaded" / "libfind.so"
    source.write_text('#include <dlfcn.h>\nextern "C" void* find(void* h) '
                      '{ return dlsym(h, "x"); }\n')
    library.parent.mkdir()
    subprocess.run(["g++", "-shared", "-fPIC", str(source), "-o", str(library)], check=True)
    loader = ("import ctypes, sys\nctypes.CDLL(sys.argv[1])\nprint('ready', flush=True)\n"
              "sys.stdin.read()\n")
    proc = subprocess.Popen([sys.executable, "-c", loader, str(library)], text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        trusted = [sys.base_prefix, sys.prefix, "/usr", "/lib", "/lib64"]
        problems = symbols.check_process(proc.pid, symbols.single_file_policy(ALLOWED),
                                         trusted)
        loaded = [path for path, _ in symbols.mapped_code(proc.pid)]
    finally:
        proc.communicate("")
    assert str(library.resolve()) in loaded and any("libc.so" in path for path in loaded)
    assert list(map(str, problems)) == [
        f"{library.resolve()} calls dlsym ({symbol_rules.LOOKUP}): not allowed"]


def test_missing_tools_and_other_files_are_named(tmp_path: Path, objects: dict[str, Path],
                                                 monkeypatch: pytest.MonkeyPatch):
    text = tmp_path / "tree" / "notes.so"
    text.parent.mkdir()
    text.write_text("not an object")
    with pytest.raises(SymbolToolError, match="not an ELF object"):
        symbols.check_file(text, symbols.single_file_policy(ALLOWED))
    (problem,) = symbols.check_tree(text.parent, symbols.single_file_policy(ALLOWED))
    assert str(problem) == ("notes.so holds code the judge cannot check (not an ELF object or "
                            "shared object): not allowed")
    copy = shutil.copy(objects["kernels/scale_add.cpp"], tmp_path / "copy.o")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SymbolToolError, match=r"nm \(GNU binutils\) is needed"):
        symbols.check_file(Path(copy), symbols.single_file_policy(ALLOWED))
    with pytest.raises(SymbolToolError, match=r"the C\+\+ compiler 'no-such-g\+\+' is needed"):
        symbols.workspace_policy("no-such-g++")


@pytest.mark.slow
def test_a_load_inline_module(tmp_path: Path):
    """What a single-file candidate compiles: at::empty, views and fills pass, at::matmul
    does not (the judge checks the folder the candidate's extensions were built in)."""
    from torch.utils.cpp_extension import load_inline

    build = tmp_path / "torch_extensions" / "symbols_probe"
    build.mkdir(parents=True)
    load_inline("symbols_probe", cpp_sources=INLINE, functions=["scale_add", "product"],
                build_directory=str(build))
    problems = symbols.check_tree(tmp_path / "torch_extensions",
                                  symbols.single_file_policy(ALLOWED))
    assert list(map(str, problems)) == [
        "symbols_probe/symbols_probe.so calls at::_ops::matmul::call(at::Tensor const&, "
        "at::Tensor const&) (PyTorch arithmetic): not allowed"]


@pytest.mark.gpu
@pytest.mark.slow
def test_a_cuda_load_inline_module(tmp_path: Path):
    """A CUDA extension's own kernel on torch's stream and cuBLAS on torch's handle pass
    (and compute); at::matmul does not."""
    import torch
    from torch.utils.cpp_extension import load_inline

    build = tmp_path / "torch_extensions" / "cuda_symbols_probe"
    build.mkdir(parents=True)
    ext = load_inline("cuda_symbols_probe", cpp_sources=CUDA_INLINE_DECLARATIONS,
                      cuda_sources=CUDA_INLINE, functions=["twice", "gemm", "product"],
                      extra_ldflags=["-lcublas"], build_directory=str(build))
    a, b = torch.randn(64, 32, device="cuda"), torch.randn(32, 16, device="cuda")
    torch.testing.assert_close(ext.twice(a), 2 * a)
    torch.testing.assert_close(ext.gemm(a, b), a.double().mm(b.double()).float(),
                               rtol=1e-4, atol=1e-4)
    problems = symbols.check_tree(tmp_path / "torch_extensions",
                                  symbols.single_file_policy(ALLOWED))
    assert [(p.where, p.symbol.split("(")[0], p.rule) for p in problems] == [(
        "cuda_symbols_probe/cuda_symbols_probe.so", "at::_ops::matmul::call",
        "PyTorch arithmetic")], list(map(str, problems))


# --- the builder: a workspace whose objects break the policy does not build ------------------

def test_a_workspace_calling_pytorch_does_not_build(tmp_path: Path):
    builder = Builder(BuildConfig(device="cpu"))
    write_solution(tmp_path)
    assert builder.build(tmp_path).ok
    (tmp_path / "kernels" / "weak_binding.cpp").write_text(WEAK_MM)
    (tmp_path / "kernels" / "pyrun_binding.cpp").write_text(kernels.PYRUN)
    result = builder.build(tmp_path)
    assert not result.ok and result.extension_path is None
    errors = [str(error) for error in result.errors]
    assert "kernels/weak_binding.cpp: error: calls at::_ops::mm::call(at::Tensor const&, " \
        "at::Tensor const&) (PyTorch arithmetic): not allowed" in errors, errors
    assert any(e.startswith("kernels/pyrun_binding.cpp: error: calls PyRun_SimpleString")
               for e in errors), errors
    assert "kernels/weak_binding.cpp: error: calls" in result.log


def _workspaces(*patterns: str) -> list[Path]:
    return sorted({path.parent.parent for pattern in patterns
                   for path in REPO.glob(pattern)})


def test_the_repositorys_cpu_workspaces_build():
    """No false refusal: every CPU kernel in the repository (examples, the workspace
    template, benchmarks) builds with the check."""
    roots = _workspaces("src/cuda_agent/examples/*/solution/cpu/kernels/*.cpp",
                        "src/cuda_agent/workspace/templates/cpu/kernels/*.cpp",
                        "benchmarks/**/kernels/*.cpp")
    roots = [root for root in roots if not any((root / "kernels").glob("*.cu"))]
    assert len(roots) >= 4
    builder = Builder(BuildConfig(device="cpu"))
    for root in roots:
        result = builder.build(root)
        assert result.ok, (root, [str(e) for e in result.errors])


@pytest.mark.gpu
def test_the_repositorys_cuda_workspaces_build():
    """No false refusal where the whole CUDA build runs (the fixed layer needs torch's CUDA
    headers): every CUDA workspace in the repository builds with the check."""
    roots = _workspaces("src/cuda_agent/examples/*/solution/cuda/kernels/*.cu",
                        "src/cuda_agent/workspace/templates/cuda/kernels/*.cu",
                        "benchmarks/**/kernels/*.cu")
    builder = Builder(BuildConfig(device="cuda"))
    for root in roots:
        result = builder.build(root)
        assert result.ok, (root, [str(e) for e in result.errors])


@pytest.mark.nvcc
@pytest.mark.slow
def test_the_repositorys_cuda_kernels_pass(policy: symbols.Policy):
    """No false refusal: every CUDA workspace in the repository compiles (nvcc, no GPU) to
    objects the check passes."""
    from tests.conftest import compile_cuda_units

    roots = _workspaces("src/cuda_agent/examples/*/solution/cuda/kernels/*.cu",
                        "src/cuda_agent/workspace/templates/cuda/kernels/*.cu",
                        "benchmarks/**/kernels/*.cu")
    assert len(roots) >= 4
    for root in roots:
        units = compile_cuda_units(root)
        assert all(status != "failed" for _, status, _, _ in units), (root, units)
        problems = symbols.check_objects([(u[0], u[2]) for u in units], policy)
        assert problems == [], (root, list(map(str, problems)))
