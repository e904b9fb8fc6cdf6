// gelu_bias_scale_binding.cpp -- checks, allocation and registration for gelu_bias_scale.
#include <cstdint>

#include "binding_registry.h"

extern "C" void gelu_bias_scale_launch(const float* x, const float* bias, float* out,
                                       int64_t rows, int64_t cols, float scale, int config);

namespace {

cuda_ext::Outputs gelu_bias_scale(const cuda_ext::Args& args) {
  const cuda_ext::Tensor& x = args.tensor(0);
  const cuda_ext::Tensor& bias = args.tensor(1);
  const float scale = static_cast<float>(args.real(2));
  CUDA_EXT_CHECK(!x.is_cuda() && !bias.is_cuda(), "x and bias must be CPU tensors");
  CUDA_EXT_CHECK(x.dtype == cuda_ext::DType::Float32, "x must be float32");
  CUDA_EXT_CHECK(bias.dtype == cuda_ext::DType::Float32, "bias must be float32");
  CUDA_EXT_CHECK(x.dim() >= 1, "x must have at least one dimension");
  CUDA_EXT_CHECK(bias.dim() == 1, "bias must be one-dimensional");
  CUDA_EXT_CHECK(bias.size(0) == x.size(-1), "bias length must match the last dimension of x");
  CUDA_EXT_CHECK(x.is_contiguous() && bias.is_contiguous(), "x and bias must be contiguous");

  cuda_ext::Tensor out = cuda_ext::empty_like(x);
  const int64_t cols = x.size(-1);
  const int64_t rows = cols == 0 ? 0 : x.numel() / cols;
  gelu_bias_scale_launch(x.data_ptr<float>(), bias.data_ptr<float>(), out.data_ptr<float>(),
                         rows, cols, scale, /*config=*/0);
  return {out};
}

}  // namespace

REGISTER_BINDING(gelu_bias_scale,
                 "gelu_bias_scale(x: Tensor, bias: Tensor, scale: float) -> Tensor",
                 gelu_bias_scale);
