"""Which symbols built code may call: the rules behind ``symbols.py``.

A rule reads one symbol (its mangled name and its demangled text) and returns why it is
refused, or None. Two policies share the same refusals of routes to code that no symbol
names, and differ in what else they allow:

- A workspace's kernels (``kernels/*.cu``, ``*.cpp``; no torch headers) may call the fixed
  layer's interface (``binding_registry.h``), the C/C++ runtime (libc, libm, libstdc++,
  libgcc), OpenMP, the CUDA runtime and driver, cuBLAS/cuBLASLt and cuDNN; torch, Python
  and pybind11 are refused by name. A weak reference must be one of the allowed (the
  runtime's names read from the libraries the compiler links): it links though nothing
  defines it, then binds to whatever the process loaded, libtorch included. A strong one
  is left to the module's link, which resolves only against the allowed libraries and
  names what they do not define.
- A single-file candidate's shared object (``load_inline`` with ``torch/extension.h``) calls
  torch by construction: torch's infrastructure passes, its operators pass only when the
  judge's run-time guard allows them (creation, views, copies, fills), and its arithmetic
  reached around the dispatcher (``at::native``, ``at::cpu``, ``at::cuda`` kernels) fails,
  as do ``redispatch`` (it skips the trace) and what switches the trace off. The Python C
  API the module needs passes; running Python source from native code does not.

Refused in both: dynamic loading and symbol lookup (``dlopen``, ``dlsym``,
``dl_iterate_phdr``, ``cuGetProcAddress``...), raw system calls, other processes and
programs, ``mprotect`` (an honest kernel never changes a page's protection; it is how
loaded code, the judge's included, is patched in memory), CUPTI, and other libraries'
arithmetic (BLAS, LAPACK, MKL, cuFFT, cuSPARSE, cuSOLVER, the cuRAND host API...).
Allowed in both: ``mmap`` (large scratch buffers) and ``pthread_create`` (``std::thread``;
threads still running after a call are the thread watch's concern). Header-only libraries
(Eigen, CUTLASS, CUB) compile into the candidate's own objects and cannot be told apart
from its own code.
"""

from __future__ import annotations

import functools
import re

DYNAMIC_LOOKUP = frozenset({
    "dlopen", "dlmopen", "dlsym", "dlvsym", "dladdr", "dladdr1", "dlinfo", "dl_iterate_phdr",
    "_r_debug", "__libc_dlopen_mode", "__libc_dlsym", "__libc_dlvsym", "__libc_dlclose",
    "cudaGetDriverEntryPoint", "cudaGetDriverEntryPointByVersion", "cuGetProcAddress",
    "cuGetProcAddress_v2", "__cudaGetProcAddress", "cudaGetExportTable", "cuGetExportTable",
})
PROCESS = frozenset({
    "syscall", "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "fork",
    "vfork", "_Fork", "clone", "clone3", "__clone", "execv", "execve", "execvp", "execvpe",
    "execl", "execle", "execlp", "fexecve", "execveat", "posix_spawn", "posix_spawnp",
    "system", "popen",
})
MEMORY_PROTECTION = frozenset({"mprotect", "pkey_mprotect", "__mprotect"})
INTERPOSABLE = DYNAMIC_LOOKUP | PROCESS | MEMORY_PROTECTION
"""Names whose definition in a candidate's shared object would not keep its calls its own:
the C library, loaded first, can take them over."""

_BLAS = (r"(?:gemm|gemv|ger[uc]?|axpy|axpby|dot[uc]?|scal|copy|swap|nrm2|asum|rotg?|rotm|"
         r"trsm|trmm|trsv|trmv|symm|symv|syrk|syr2k|hemm|hemv|herk|her2k|gbmv|sbmv|spmv|"
         r"getrf|getrs|getri|gesv|gesvd|gesdd|geqrf|orgqr|ungqr|potrf|potrs|potri|syev|syevd|"
         r"heev|heevd|gels|gelsd|trtrs|amax|amin)")
MATH_LIBRARIES = (
    # as libraries export them: sgemm_, sgemm, SGEMM (MKL inside libtorch exports all three)
    (re.compile(rf"^i?[sdcz]{_BLAS}(?:_64)?_?$|^(?:cblas|openblas|goto)_\w+$", re.I), "BLAS"),
    (re.compile(r"^(?:LAPACKE?|lapacke?)_\w+$"), "LAPACK"),
    (re.compile(r"^(?:mkl|MKL|vml|vsl|vm?[sdcz][A-Z])\w*$"), "MKL"),
    (re.compile(r"^(?:dnnl|mkldnn)_\w+$"), "oneDNN"),
    (re.compile(r"^fftw\w*$"), "FFTW"),
    (re.compile(r"^cufft\w*$"), "cuFFT"),
    (re.compile(r"^cusparse\w*$"), "cuSPARSE"),
    (re.compile(r"^cusolver\w*$"), "cuSOLVER"),
    (re.compile(r"^curand[A-Z]\w*$"), "the cuRAND host API"),
    (re.compile(r"^cutensor\w*$"), "cuTENSOR"),
    (re.compile(r"^(?:npp|nvjpeg|cudss|nccl[A-Z])\w*$"), "a CUDA math library"),
    (re.compile(r"^(?:Sleef_|xnn_|pytorch_qnnp_|qnnp_|nnp_|pthreadpool_)\w*$"),
     "a math library PyTorch carries (SLEEF, XNNPACK, QNNPACK, NNPACK)"),
)
MATH_NAMESPACES = re.compile(r"^(?:fbgemm|fbgemm_gpu|dnnl|mkldnn|ideep|mkl|sleef|xnnpack|"
                             r"qnnpack|nnpack|onednn|cutlass_extensions)::")
"""C++ math libraries PyTorch links in, by their demangled names (``fbgemm::cblas_sgemm_ref``)."""
CUDA = re.compile(r"^(?:cuda[A-Z]\w*|__cuda\w+|cu[A-Z]\w*|cublas\w*|cudnn\w*)$")
OPENMP = re.compile(r"^(?:GOMP_\w+|GOACC_\w+|omp_\w+|__kmpc_\w+)$")
PYTHON = re.compile(r"^_?Py[A-Z_]\w*$")
PYTHON_CODE = re.compile(r"^(?:PyRun_\w+|Py_CompileString\w*|PyEval_EvalCode\w*|"
                         r"PyImport_ExecCodeModule\w*|PyEval_SetTrace|PyEval_SetProfile\w*)$")
PYTHON_IMPORT = re.compile(r"^(?:PyImport_\w+|_PyImport_\w+)$")
TORCH = re.compile(r"(?:^|[^\w:])(?:at|c10|torch|caffe2|aten)::")
TORCH_C = re.compile(r"^(?:THP\w+|aoti_torch_\w+|torch_\w+)$")
FIXED_API = ("cuda_ext::empty(", "cuda_ext::current_stream(", "cuda_ext::register_binding(")
"""What ``binding_registry.h`` declares and the fixed layer defines."""
LINKER = frozenset({"_GLOBAL_OFFSET_TABLE_", "__dso_handle", "_DYNAMIC", "__gmon_start__",
                    "_ITM_deregisterTMCloneTable", "_ITM_registerTMCloneTable"})

OPS = re.compile(r"^at::_ops::(\w+)::(call|redispatch)\(")
BACKENDS = re.compile(r"^at::(native|cpu|cuda|meta|mps|xpu|hip|mkldnn|vulkan|lazy|sparse\w*|"
                      r"quantized\w*|composite\w*|nested\w*)::")
BACKEND_ACCESSORS = re.compile(
    r"^at::cuda::(?:detail::|getCurrentCUDABlas(?:Lt)?Handle\(|getCUDABlasLtWorkspace\w*\(|"
    r"getChosenWorkspaceSize\(|getCurrentDeviceProperties\(|getDeviceProperties\(|"
    r"warp_size\(|getNumGPUs\(|is_available\(|canDeviceAccessPeer\(|getCUDADeviceAllocator\(|"
    r"\w*Stream\w*\()"
    r"|^at::cpu::(?:is_\w+|\w*cache\w*|init_amx|get_cpu_capability)\(")
def compiled_kernel(plain: str) -> bool:
    """A symbol built code defines that is PyTorch's arithmetic, compiled from the headers
    torch ships (``at::native::serial_vec_log_softmax_lastdim_range<float>``): the dispatcher
    never sees it, nor does a check of what the code imports."""
    return bool(BACKENDS.match(plain)) and not BACKEND_ACCESSORS.match(plain)


MATH_HANDLES = re.compile(r"^at::cuda::getCurrentCUDA(?:SolverDn|Sparse)Handle\(")
TORCH_FRONTEND = re.compile(r"^torch::(?:nn|jit|optim|data|linalg|fft|special)::")
TRACE_SWITCHES = re.compile(
    r"^(?:at::(?:clearCallbacks|clearGlobalCallbacks|clearThreadLocalCallbacks|removeCallback|"
    r"disableCallback|enableRecordFunction|set_record_function_tls_)\b|"
    r"c10::impl::(?:TorchDispatchModeTLS|PythonDispatcherTLS|PythonTorchFunctionTLS)::|"
    r"c10::impl::_force_tls_local_dispatch_key_set\b)")
BY_NAME = re.compile(r"^(?:c10::Dispatcher::(?:findSchema\w*|findOp|findOrRegister\w*)\b|"
                     r"(?:aoti_)?torch_call_dispatcher$)")
AOTI_KERNELS = re.compile(r"^aoti_torch_(?:cpu|cuda|mps|xpu)_\w+$")

LOOKUP = "dynamic loading or symbol lookup, which reaches code no symbol names"


def common(name: str, plain: str = "") -> str | None:
    """Refusals shared by every policy: routes around any symbol check, other processes,
    the profiler's activity API and other libraries' arithmetic (``plain``: the demangled
    name)."""
    if name in DYNAMIC_LOOKUP or name.startswith("_dl_"):
        return LOOKUP
    if name in PROCESS:
        return "raw system calls, other processes or programs"
    if name in MEMORY_PROTECTION:
        return "changes memory protection, the way loaded code is patched"
    if name.startswith("cupti"):
        return "the device's activity API, which the judge records with"
    for pattern, library in MATH_LIBRARIES:
        if pattern.match(name):
            return f"another library's arithmetic: {library}"
    if MATH_NAMESPACES.match(plain):
        return f"another library's arithmetic: {plain.split('::', 1)[0]}"
    return None


def workspace(name: str, plain: str, own: bool, runtime: frozenset[str], linked: bool
              ) -> str | None:
    """A workspace kernel's reference: ``own`` when another of the candidate's objects
    defines it (a refused name stays refused: the C library, loaded first, can take the
    call over); ``runtime`` holds the C/C++ runtime's names; ``linked`` when the module's
    link must still resolve it (a strong reference of an object), which names it if the
    libraries it links (the fixed layer, the runtime, cudart, cuBLAS) do not define it."""
    refused = common(name, plain)
    if refused:
        return refused
    if PYTHON.match(name):
        return "the Python C API, which workspace kernels do not call"
    if "pybind11::" in plain:
        return "pybind11, which workspace kernels do not call"
    if TORCH.search(plain) or TORCH_C.match(name):
        arithmetic = OPS.match(plain) or AOTI_KERNELS.match(name) or \
            TORCH_FRONTEND.match(plain) or \
            BACKENDS.match(plain) and not BACKEND_ACCESSORS.match(plain)
        return "PyTorch arithmetic" if arithmetic else \
            "PyTorch, which workspace kernels reach only through binding_registry.h"
    if own or CUDA.match(name) or OPENMP.match(name) or name in LINKER or name in runtime:
        return None
    if plain.startswith("cuda_ext::"):
        return None if plain.startswith(FIXED_API) else \
            "not part of the fixed layer's interface, binding_registry.h"
    if linked:
        return None
    return "not the fixed layer, the C/C++ runtime, OpenMP, the CUDA runtime, cuBLAS or cuDNN"


def single_file(name: str, plain: str, allowed_ops: frozenset[str]) -> str | None:
    """A ``load_inline`` shared object's reference: torch's operators are checked against
    ``allowed_ops`` (the run-time guard's ``ALLOWED``) by their schema name."""
    refused = common(name, plain)
    if refused:
        return refused
    if PYTHON_CODE.match(name):
        return "runs Python code or tracing from native code"
    if PYTHON_IMPORT.match(name):
        return "imports Python modules from native code (past model_new.py's static check)"
    ops = OPS.match(plain)
    if ops:
        if ops[2] == "redispatch":
            return "PyTorch redispatch, which skips the operator trace"
        op = operator_names().get(ops[1])
        if op is None:
            return "an operator this torch does not know"
        return None if op in allowed_ops or op.rstrip("_") in allowed_ops else \
            "PyTorch arithmetic"
    if MATH_HANDLES.match(plain):
        return "another library's arithmetic: cuSOLVER or cuSPARSE"
    if BACKENDS.match(plain) and not BACKEND_ACCESSORS.match(plain) or \
            AOTI_KERNELS.match(name) or TORCH_FRONTEND.match(plain):
        return "PyTorch arithmetic outside the dispatcher"
    if TRACE_SWITCHES.match(plain):
        return "switches off the judge's operator trace"
    if BY_NAME.match(plain):
        return "looks up PyTorch operators by name, which this check cannot follow"
    return None


@functools.lru_cache(maxsize=1)
def operator_names() -> dict[str, str]:
    """``at::_ops`` struct name -> operator name, from this torch's schemas:
    ``add_Tensor`` -> ``add``, ``fill__Scalar`` -> ``fill_``, ``mm`` -> ``mm``."""
    import torch

    names = {}
    for schema in torch._C._jit_get_all_schemas():
        if schema.name.startswith("aten::"):
            op = schema.name.split("::", 1)[1]
            names[op + (f"_{schema.overload_name}" if schema.overload_name else "")] = op
    return names
