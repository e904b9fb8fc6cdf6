"""C++ and CUDA sources for the symbol check's tests (``test_symbols.py``): honest kernels,
kernels that call PyTorch, Python, dynamic lookup or other libraries, and a load_inline
extension."""

# what a kernel sees of torch when it declares torch's symbols itself (no torch header)
TORCH_DECLARATIONS = """
#include <cstdint>
namespace c10 { struct DispatchKeySet { uint64_t repr; }; struct OperatorName; struct Error; }
namespace at {
struct Tensor { void* impl; Tensor(const Tensor& o) : impl(o.impl) {} ~Tensor() {} };
namespace _ops {
struct add_Tensor {
  static Tensor call(const Tensor&, const Tensor&, double);
  static Tensor redispatch(c10::DispatchKeySet, const Tensor&, const Tensor&, double);
};
struct empty_like { static Tensor call(const Tensor&); };
struct fill__Scalar { static Tensor& call(Tensor&, double); };
struct mm { __attribute__((weak)) static Tensor call(const Tensor&, const Tensor&); };
}
namespace native { Tensor mm(const Tensor&, const Tensor&); }
namespace cpu { Tensor mm(const Tensor&, const Tensor&); }
namespace cuda { void* getCurrentCUDABlasHandle(); void* getCurrentCUDASparseHandle(); }
void clearCallbacks();
}
namespace c10 {
struct Dispatcher { void* findSchemaOrThrow(const char*, const char*); };
namespace detail { void torchCheckFail(const char*, const char*, unsigned, const char*); }
}
extern "C" int PyRun_SimpleString(const char*);
extern "C" void* PyObject_GetAttrString(void*, const char*);
"""

TORCH_CALLS = TORCH_DECLARATIONS + """
extern "C" void torch_calls(at::Tensor& t, c10::Dispatcher& d) {
  at::_ops::add_Tensor::call(t, t, 1.0);
  at::_ops::add_Tensor::redispatch(c10::DispatchKeySet{0}, t, t, 1.0);
  at::_ops::empty_like::call(t);
  at::_ops::fill__Scalar::call(t, 0.0);
  if (&at::_ops::mm::call) at::_ops::mm::call(t, t);  // weak: no link error if absent
  at::native::mm(t, t);
  at::cpu::mm(t, t);
  at::cuda::getCurrentCUDABlasHandle();
  at::cuda::getCurrentCUDASparseHandle();
  at::clearCallbacks();
  d.findSchemaOrThrow("aten::mm", "");
  c10::detail::torchCheckFail("f", "file", 1, "message");
  PyRun_SimpleString("import torch");
  PyObject_GetAttrString(nullptr, "x");
}
"""

LOOKUP = """
#include <dlfcn.h>
#include <link.h>
#include <unistd.h>
#include <cstdio>
#include <sys/mman.h>
extern "C" int cudaGetDriverEntryPoint(const char*, void**, unsigned long long, void*);
static int count(dl_phdr_info*, size_t, void* n) { return ++*static_cast<int*>(n), 0; }
extern "C" long lookup(void* page) {
  void* lib = dlopen("libtorch_cpu.so", RTLD_NOW);
  void* fn = dlsym(lib, "_ZN2at4_ops2mm4callERKNS_6TensorES4_");
  int n = 0;
  dl_iterate_phdr(count, &n);
  mprotect(page, 4096, PROT_READ | PROT_WRITE | PROT_EXEC);
  FILE* pipe = popen("python -c 'import torch'", "r");
  void* entry = nullptr;
  cudaGetDriverEntryPoint("cuGetProcAddress", &entry, 0, nullptr);
  return syscall(39) + n + (fn != nullptr) + (pipe != nullptr) + (entry != nullptr);
}
"""

# a definition of its own does not make a refused name the kernel's: the C library, loaded
# first, answers the call
OWN_DLSYM = 'extern "C" void* dlsym(void*, const char*) { return nullptr; }\n'

# a weak reference links though nothing defines it, and binds to whatever the process loaded
# by that name; a strong one to a name defined nowhere is the link's to name
UNKNOWN = """
extern "C" __attribute__((weak)) float fast_gemm(const float*, int);
extern "C" float missing_launch(int);
extern "C" float unknown(const float* a, int n) {
  return (fast_gemm ? fast_gemm(a, n) : 0.f) + missing_launch(n);
}
"""

LIBRARIES = """
extern "C" void cblas_sgemm(int, int, int, int, int, int, float, const float*, int,
                            const float*, int, float, float*, int);
extern "C" void sgemm_(const char*, const char*, const int*, const int*, const int*,
                       const float*, const float*, const int*, const float*, const int*,
                       const float*, float*, const int*);
extern "C" int LAPACKE_sgesv(int, int, int, float*, int, int*, float*, int);
extern "C" void blas(float* a, int n) {
  cblas_sgemm(101, 111, 111, n, n, n, 1.f, a, n, a, n, 0.f, a, n);
  const char t = 'N';
  const float one = 1.f;
  sgemm_(&t, &t, &n, &n, &n, &one, a, &n, a, &n, &one, a, &n);
  LAPACKE_sgesv(101, n, 1, a, n, nullptr, a, 1);
}
"""

# what an honest CPU kernel uses: OpenMP, threads, libm, thread-local state, mmap, stdio
RUNTIME = """
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <thread>
#include <vector>
#include <sys/mman.h>
#include <omp.h>
thread_local int lane = 0;
extern "C" double runtime_launch(const float* x, float* out, int64_t n) {
  double total = 0;
#pragma omp parallel for reduction(+ : total) schedule(dynamic)
  for (int64_t i = 0; i < n; ++i) {
    out[i] = std::exp(x[i]) + std::tanh(x[i]) + std::pow(x[i], 2.5f);
    total += out[i];
  }
  std::atomic<int> seen{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < 2; ++t) pool.emplace_back([&seen, t] { lane = t; seen += 1; });
  for (auto& t : pool) t.join();
  void* scratch = mmap(nullptr, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                       -1, 0);
  munmap(scratch, 1 << 20);
  if (__builtin_cpu_supports("avx2")) std::printf("%d\\n", omp_get_max_threads());
  return total + seen;
}
"""

# cuBLAS's declarations as cublas_v2.h spells them (the toolkit here has no cuBLAS headers)
CUBLAS = """
#include <cuda_runtime.h>
#include <cstdint>
typedef struct cublasContext* cublasHandle_t;
extern "C" int cublasCreate_v2(cublasHandle_t*);
extern "C" int cublasSetStream_v2(cublasHandle_t, cudaStream_t);
extern "C" int cublasSgemm_v2(cublasHandle_t, int, int, int, int, int, const float*,
                              const float*, int, const float*, int, const float*, float*, int);
__global__ void add_bias(float* c, const float* bias, int64_t n, int cols) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) c[i] += bias[i % cols];
}
extern "C" void gemm_bias_launch(const float* a, const float* b, const float* bias, float* c,
                                 int m, int n, int k, cudaStream_t stream) {
  static cublasHandle_t handle = nullptr;
  if (!handle) cublasCreate_v2(&handle);
  cublasSetStream_v2(handle, stream);
  const float one = 1.0f, zero = 0.0f;
  cublasSgemm_v2(handle, 0, 0, n, m, k, &one, b, n, a, k, &zero, c, n);
  add_bias<<<(m * n + 255) / 256, 256, 0, stream>>>(c, bias, static_cast<int64_t>(m) * n, n);
}
"""

CUDA_LIBRARIES = """
#include <cuda_runtime.h>
extern "C" int cufftExecR2C(int, float*, void*);
extern "C" int cusparseSpMM(void*, int, int, const void*, void*, void*, const void*, void*,
                            int, int, void*);
extern "C" int curandGenerateUniform(void*, float*, unsigned long);
extern "C" void spectral(float* x) {
  cufftExecR2C(0, x, x);
  cusparseSpMM(nullptr, 0, 0, nullptr, nullptr, nullptr, nullptr, nullptr, 0, 0, nullptr);
  curandGenerateUniform(nullptr, x, 16);
}
"""

INLINE = r"""
#include <torch/extension.h>
torch::Tensor scale_add(torch::Tensor x, torch::Tensor y, double alpha) {
  TORCH_CHECK(x.is_contiguous() && x.scalar_type() == at::kFloat, "x: contiguous float32");
  auto out = at::empty(x.sizes(), x.options());
  auto spare = torch::empty_like(x).zero_();
  const float* px = x.data_ptr<float>();
  const float* py = y.data_ptr<float>();
  float* po = out.data_ptr<float>();
  at::parallel_for(0, x.numel(), 4096, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) po[i] = alpha * px[i] + py[i];
  });
  return out.view({-1}).contiguous();
}
torch::Tensor product(torch::Tensor a, torch::Tensor b) { return at::matmul(a, b); }
"""


# a weak reference links (the linker lets it stay unresolved) and the loader binds it to
# libtorch, which the fixed library brings: only the symbol check sees it
WEAK_MM = TORCH_DECLARATIONS + """
#include "binding_registry.h"
static cuda_ext::Outputs weak_mm(const cuda_ext::Args& args) {
  const cuda_ext::Tensor& x = args.tensor(0);
  const at::Tensor& t = *static_cast<const at::Tensor*>(x.handle.get());
  if (&at::_ops::mm::call) at::_ops::mm::call(t, t);
  return {x};
}
REGISTER_BINDING(weak_mm, "weak_mm(x)", weak_mm);
"""



# a CUDA extension as a single-file candidate writes one: its own kernel on torch's stream,
# cuBLAS on torch's handle, and (not allowed) PyTorch's matmul
CUDA_INLINE_DECLARATIONS = """
torch::Tensor twice(torch::Tensor x);
torch::Tensor gemm(torch::Tensor a, torch::Tensor b);
torch::Tensor product(torch::Tensor a, torch::Tensor b);
"""

CUDA_INLINE = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <cublas_v2.h>

__global__ void twice_kernel(const float* x, float* y, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) y[i] = 2.0f * x[i];
}

torch::Tensor twice(torch::Tensor x) {
  TORCH_CHECK(x.is_cuda() && x.is_contiguous() && x.scalar_type() == at::kFloat, "x");
  auto y = torch::empty_like(x);
  const int64_t n = x.numel();
  twice_kernel<<<(n + 255) / 256, 256, 0, at::cuda::getCurrentCUDAStream()>>>(
      x.data_ptr<float>(), y.data_ptr<float>(), n);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return y;
}

torch::Tensor gemm(torch::Tensor a, torch::Tensor b) {
  auto c = at::empty({a.size(0), b.size(1)}, a.options());
  cublasHandle_t handle = at::cuda::getCurrentCUDABlasHandle();
  TORCH_CHECK(cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH) == CUBLAS_STATUS_SUCCESS);
  const float one = 1.0f, zero = 0.0f;
  const int m = a.size(0), k = a.size(1), n = b.size(1);
  TORCH_CHECK(cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &one, b.data_ptr<float>(),
                          n, a.data_ptr<float>(), k, &zero, c.data_ptr<float>(), n) ==
              CUBLAS_STATUS_SUCCESS);
  return c;
}

torch::Tensor product(torch::Tensor a, torch::Tensor b) { return at::matmul(a, b); }
"""

# the C++ runtime's own code linked into an extension (the H100 machine's GCC links the
# newer parts of libstdc++ statically): the guard of a function-local static waits on a
# futex through syscall. STATIC_GUARD alone passes; with RAW_SYSCALL or SYSCALL_ADDRESS the
# candidate's own code reaches syscall too
STATIC_GUARD = """
#include <sys/syscall.h>
#include <unistd.h>
extern "C" int __cxa_guard_acquire(long long* guard) {
  return syscall(SYS_futex, guard, 0, 0, nullptr, nullptr, 0) >= 0 && *guard == 0;
}
extern "C" void __cxa_guard_release(long long* guard) { *guard = 1; }
extern "C" int cached(int x) {
  static int first = x * 2;
  return first;
}
"""
RAW_SYSCALL = 'extern "C" long own_pid() { return syscall(SYS_getpid); }\n'
SYSCALL_ADDRESS = 'extern "C" void* syscall_address() { return (void*)&syscall; }\n'
