"""A single-file candidate's ``load_inline`` built by the judge (``build.inline``): which
flags are taken, what a request may hold, one compile per source and toolchain (another
builder on the same cache, as another process is, compiles nothing), an edit recompiling
only the file it changed, a module calling PyTorch refused before it is placed, and CUDA
sources through nvcc. Real compiles; the modules that need no torch headers compile in
about a second."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from cuda_agent.build import BuildConfig, Builder, symbols
from cuda_agent.build.inline import InlineBuilder, InlineRequest, RequestError
from cuda_agent.build.inline_flags import FlagError, cxx_flags, ld_flags, nvcc_flags
from cuda_agent.judge.guard import ALLOWED
from cuda_agent.judge.inline_load import inline_request

POLICY = symbols.single_file_policy(ALLOWED)
# a Python module without torch's headers: compiles in about a second
PLAIN_MODULE = """
#include <Python.h>
static PyObject* answer(PyObject*, PyObject*) { return PyLong_FromLong(ANSWER); }
static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, ""}, {nullptr}};
static PyModuleDef def = {PyModuleDef_HEAD_INIT, "plain_ext", nullptr, -1, methods};
PyMODINIT_FUNC PyInit_plain_ext(void) { return PyModule_Create(&def); }
"""
# PyTorch's add, declared as its header does (the headers take seconds to compile)
ATEN_CALL = """
namespace c10 { class Scalar; }
namespace at { class Tensor; namespace _ops { struct add_out {
  static Tensor& call(const Tensor&, const Tensor&, const c10::Scalar&, Tensor&); }; } }
extern "C" void add_them(at::Tensor& out, const at::Tensor& x, const c10::Scalar& a) {
  at::_ops::add_out::call(x, x, a, out);
}
"""
KERNEL = """
__global__ void twice(float* x, int n) { int i = threadIdx.x; if (i < n) x[i] *= 2.0f; }
extern "C" void twice_launch(float* x, int n) { twice<<<1, 32>>>(x, n); }
"""
DEFAULTS = {"cuda_sources": None, "functions": None, "extra_cflags": None,
            "extra_cuda_cflags": None, "extra_ldflags": None, "extra_include_paths": None,
            "with_cuda": None, "with_pytorch_error_handling": True}


def request(**arguments) -> InlineRequest:
    """As the candidate's process sends a ``load_inline`` call (``inline_load``)."""
    return InlineRequest.parse(inline_request({**DEFAULTS, **arguments}))


def plain(answer: int = 42, **more) -> InlineRequest:
    return request(name="plain_ext", cpp_sources=PLAIN_MODULE.replace("ANSWER", str(answer)),
                   no_implicit_headers=True, **more)


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "cache"


def inline(cache: Path, **config) -> InlineBuilder:
    """A builder on ``cache``: a new one stands for another process or judgement."""
    return InlineBuilder(Builder(BuildConfig(cache_dir=cache, **config)), POLICY)


def test_the_candidates_flags_the_judge_takes():
    assert cxx_flags(["-O3", "", "-march=native -fopenmp", "-ffast-math", "-DN=4", "-Wall"]) \
        == ["-O3", "-march=native", "-fopenmp", "-ffast-math", "-DN=4", "-Wall"]
    assert nvcc_flags(["-O3", "--use_fast_math", "-Xptxas -O3,-v", "-arch=sm_80",
                       "-gencode", "arch=compute_80,code=sm_80", "-Xcompiler", "-fopenmp",
                       "-std=c++17"]) == ["-O3", "--use_fast_math", "-Xptxas", "-O3,-v",
                                          "-Xcompiler", "-fopenmp", "-std=c++17"]
    assert ld_flags(["-lcublas", "-fopenmp", "-Wl,--no-as-needed"], cuda=True) == [
        "-lcublas", "-fopenmp", "-Wl,--no-as-needed"]
    for flags in (["-fplugin=/tmp/evil.so"], ["-B/tmp"], ["-I/tmp"], ["-Wl,-rpath,/tmp"],
                  ["-include", "/etc/passwd"], ["@/tmp/flags"], ["-o", "x"], ["-specs=x"],
                  ["-fdump-tree-all"], ["-save-temps"], ["-wrapper", "x"], ["-flto"]):
        with pytest.raises(FlagError, match="not a flag the judge compiles with"):
            cxx_flags(flags)
    for flags in (["-ccbin", "/tmp"], ["-Xcompiler", "-fplugin=x.so"], ["--keep"],
                  ["-rdc=true"], ["-Xptxas", "-o,/tmp/x"], ["-Xlinker", "x"]):
        with pytest.raises(FlagError):
            nvcc_flags(flags)
    for flags, cuda in ((["-lcurand"], True), (["-L/tmp"], True), (["-lcublas"], False)):
        with pytest.raises(FlagError, match="not linked by the judge"):
            ld_flags(flags, cuda)


def test_what_a_request_may_hold():
    built = request(name="ext", cpp_sources="int f();", cuda_sources="__global__ void k(){}",
                    functions={"f": "doc"}, extra_cflags=["-O3"])
    assert [u.file for u in built.units] == ["main.cpp", "cuda.cu"] and built.with_cuda
    main, cuda = (u.text for u in built.units)
    assert main.startswith("#include <torch/extension.h>\nint f();")
    assert 'm.def("f", torch::wrap_pybind_function(f), "doc");' in main
    assert cuda.startswith("#include <torch/types.h>\n#include <cuda.h>")
    bad = [({"name": "no-dash"}, "name"), ({"units": []}, "units"),
           ({"units": [{"file": "../x.cpp", "text": ""}]}, "units"),
           ({"units": [{"file": "a.cpp", "text": ""}] * 2}, "same name"),
           ({"include_paths": ["/tmp"]}, "extra_include_paths"),
           ({"cflags": ["-fplugin=x.so"]}, "extra_cflags"), ({"cflags": "-O3"}, "extra_cflags")]
    for change, message in bad:
        fields = {"name": "ext", "units": [{"file": "main.cpp", "text": ""}], **change}
        with pytest.raises(RequestError, match=message):
            InlineRequest.parse(fields)


def test_cuda_sources_on_the_cpu_are_refused_unbuilt(cache: Path):
    refused = inline(cache).build(request(name="ext", cpp_sources="", cuda_sources="x"))
    assert not refused.ok and "need the judge's --device cuda" in refused.refused[0][1]
    assert not (cache / "objects").exists()


def test_one_compile_per_source_and_an_edit_compiles_again(cache: Path):
    first = inline(cache).build(plain())
    assert first.ok and first.compiled == ("main.cpp",) and first.cached == (), first.log
    spec = importlib.util.spec_from_file_location("plain_ext", first.path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.answer() == 42
    objects = sorted((cache / "objects").rglob("*.o"))
    again = inline(cache).build(plain())  # another process, another judgement
    assert again.ok and again.compiled == () and again.cached == ("main.cpp",)
    assert again.path == first.path and sorted((cache / "objects").rglob("*.o")) == objects
    edited = inline(cache).build(plain(answer=7))
    assert edited.ok and edited.compiled == ("main.cpp",) and edited.path != first.path
    flagged = inline(cache).build(plain(extra_cflags=["-O2"]))  # flags are in the key
    assert flagged.ok and flagged.compiled == ("main.cpp",)


def test_a_module_calling_pytorch_is_refused_and_never_placed(cache: Path):
    refused = inline(cache).build(request(name="aten_call", cpp_sources=ATEN_CALL,
                                          no_implicit_headers=True))
    assert not refused.ok and refused.path is None and refused.compiled == ("main.cpp",)
    assert refused.refused[0][0] == "aten_call.so"
    assert refused.refused[0][1].startswith("calls at::_ops::add_out::call(")
    assert "(PyTorch arithmetic): not allowed" in str(refused.result("cpu").errors[0])
    assert not list((cache / "inline").rglob("*.so"))
    again = inline(cache).build(request(name="aten_call", cpp_sources=ATEN_CALL,
                                        no_implicit_headers=True))
    assert again.refused == refused.refused and again.compiled == ()  # the record is kept


def test_a_compile_error_is_reported_with_its_line(cache: Path):
    broken = inline(cache).build(request(name="broken", cpp_sources="int f() { return x; }\n",
                                         no_implicit_headers=True))
    assert not broken.ok and broken.compiled == ()
    (error, *_) = broken.result("cpu").errors
    assert (error.file, error.line) == ("main.cpp", 1) and "was not declared" in \
        error.message


@pytest.mark.nvcc
def test_cuda_sources_compile_with_nvcc_once(cache: Path):
    """A CUDA ``load_inline`` builds through nvcc here (no GPU: nothing runs); where torch
    has no CUDA libraries (a CPU wheel) only the link fails. An edit of the CUDA source
    recompiles that file alone."""
    builder = inline(cache, device="cuda", arch="90a")

    def cuda(kernel: str) -> InlineRequest:
        return request(name="plain_ext", cpp_sources=PLAIN_MODULE.replace("ANSWER", "1"),
                       cuda_sources=kernel, no_implicit_headers=True,
                       extra_cuda_cflags=["-O3", "--use_fast_math", "-arch=sm_80"])

    command = builder.command(builder.builder.chain, cuda(KERNEL), cuda(KERNEL).units[1])
    assert "-gencode=arch=compute_90a,code=sm_90a" in command and "-arch=sm_80" not in command
    first = builder.build(cuda(KERNEL))
    assert first.compiled == ("main.cpp", "cuda.cu"), first.log
    assert first.ok or "-lc10_cuda" in first.log or "-ltorch_cuda" in first.log, first.log
    again = inline(cache, device="cuda", arch="90a").build(cuda(KERNEL))
    assert again.compiled == () and again.cached == ("main.cpp", "cuda.cu")
    edited = builder.build(cuda(KERNEL.replace("2.0f", "3.0f")))
    assert edited.compiled == ("cuda.cu",) and edited.cached == ("main.cpp",)
