// rms_norm_binding.cpp -- checks, allocation and registration for rms_norm.
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "binding_registry.h"

extern "C" int rms_norm_launch(const void* x, const void* weight, void* out, int64_t rows,
                               int64_t cols, float eps, int dtype, int config,
                               cudaStream_t stream);

namespace {

// The kernel's dtype code: 0 float32, 1 float16, 2 bfloat16; -1 for any other dtype.
int dtype_code(cuda_ext::DType dtype) {
  switch (dtype) {
    case cuda_ext::DType::Float32: return 0;
    case cuda_ext::DType::Float16: return 1;
    case cuda_ext::DType::BFloat16: return 2;
    default: return -1;
  }
}

cuda_ext::Outputs rms_norm(const cuda_ext::Args& args) {
  const cuda_ext::Tensor& x = args.tensor(0);
  const cuda_ext::Tensor& weight = args.tensor(1);
  const float eps = static_cast<float>(args.real(2));
  CUDA_EXT_CHECK(x.is_cuda(), "x must be a CUDA tensor");
  CUDA_EXT_CHECK(weight.device == x.device, "x and weight must be on the same device");
  const int code = dtype_code(x.dtype);
  CUDA_EXT_CHECK(code >= 0, "x must be float32, float16 or bfloat16");
  CUDA_EXT_CHECK(weight.dtype == x.dtype, "weight must have the dtype of x");
  CUDA_EXT_CHECK(x.dim() >= 1, "x must have at least one dimension");
  CUDA_EXT_CHECK(weight.dim() == 1, "weight must be one-dimensional");
  CUDA_EXT_CHECK(weight.size(0) == x.size(-1),
                 "weight length must match the last dimension of x");
  CUDA_EXT_CHECK(x.is_contiguous() && weight.is_contiguous(), "x and weight must be contiguous");

  cuda_ext::Tensor out = cuda_ext::empty_like(x);
  const int64_t cols = x.size(-1);
  const int64_t rows = cols == 0 ? 0 : x.numel() / cols;
  const int status = rms_norm_launch(x.data, weight.data, out.data, rows, cols, eps, code,
                                     /*config=*/0,
                                     static_cast<cudaStream_t>(cuda_ext::current_stream(x)));
  CUDA_EXT_CHECK(status == 0, "rms_norm: the kernel does not support this dtype");
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    throw std::runtime_error(std::string("rms_norm: kernel launch failed: ") +
                             cudaGetErrorString(err));
  return {out};
}

}  // namespace

REGISTER_BINDING(rms_norm, "rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor",
                 rms_norm);
