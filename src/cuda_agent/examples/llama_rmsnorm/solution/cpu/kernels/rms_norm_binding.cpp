// rms_norm_binding.cpp -- checks, allocation and registration for rms_norm.
#include <cstdint>

#include "binding_registry.h"

extern "C" void rms_norm_launch(const float* x, const float* weight, float* out, int64_t rows,
                                int64_t cols, float eps, int config);

namespace {

cuda_ext::Outputs rms_norm(const cuda_ext::Args& args) {
  const cuda_ext::Tensor& x = args.tensor(0);
  const cuda_ext::Tensor& weight = args.tensor(1);
  const float eps = static_cast<float>(args.real(2));
  CUDA_EXT_CHECK(!x.is_cuda() && !weight.is_cuda(), "x and weight must be CPU tensors");
  CUDA_EXT_CHECK(x.dtype == cuda_ext::DType::Float32, "x must be float32");
  CUDA_EXT_CHECK(weight.dtype == cuda_ext::DType::Float32, "weight must be float32");
  CUDA_EXT_CHECK(x.dim() >= 1, "x must have at least one dimension");
  CUDA_EXT_CHECK(weight.dim() == 1, "weight must be one-dimensional");
  CUDA_EXT_CHECK(weight.size(0) == x.size(-1),
                 "weight length must match the last dimension of x");
  CUDA_EXT_CHECK(x.is_contiguous() && weight.is_contiguous(), "x and weight must be contiguous");

  cuda_ext::Tensor out = cuda_ext::empty_like(x);
  const int64_t cols = x.size(-1);
  const int64_t rows = cols == 0 ? 0 : x.numel() / cols;
  rms_norm_launch(x.data_ptr<float>(), weight.data_ptr<float>(), out.data_ptr<float>(), rows,
                  cols, eps, /*config=*/0);
  return {out};
}

}  // namespace

REGISTER_BINDING(rms_norm, "rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor",
                 rms_norm);
