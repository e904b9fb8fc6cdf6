// layer_norm_binding.cpp -- cuda_extension.layer_norm(x, weight, bias, eps) on the CPU.
//
// Normalises over the trailing weight.dim() dimensions of x, whose sizes must equal
// weight's (torch.nn.LayerNorm with elementwise_affine=True).
#include <string>

#include "binding_registry.h"

extern "C" int layer_norm_cpu(const float* x, const float* w, const float* b, float* y,
                              int64_t rows, int64_t d, float eps);

static cuda_ext::Outputs layer_norm(const cuda_ext::Args& args) {
  CUDA_EXT_CHECK(args.size() == 4, "layer_norm(x, weight, bias, eps) takes 4 arguments");
  const cuda_ext::Tensor& x = args.tensor(0);
  const cuda_ext::Tensor& w = args.tensor(1);
  const cuda_ext::Tensor& b = args.tensor(2);
  const double eps = args.real(3);
  CUDA_EXT_CHECK(eps >= 0.0, "eps must be non-negative");
  for (const cuda_ext::Tensor* t : {&x, &w, &b}) {
    CUDA_EXT_CHECK(t->dtype == cuda_ext::DType::Float32, "x, weight and bias must be float32");
    CUDA_EXT_CHECK(!t->is_cuda(), "x, weight and bias must be CPU tensors");
    // (An empty tensor needs no layout; the header's is_contiguous rejects some of them.)
    CUDA_EXT_CHECK(t->numel() == 0 || t->is_contiguous(), "x, weight and bias must be contiguous");
  }
  CUDA_EXT_CHECK(w.sizes == b.sizes, "weight and bias must have the same shape");
  CUDA_EXT_CHECK(w.dim() >= 1 && x.dim() >= w.dim(),
                 "x must have at least as many dimensions as weight");
  const int lead = x.dim() - w.dim();
  for (int i = 0; i < w.dim(); ++i)
    CUDA_EXT_CHECK(x.size(lead + i) == w.size(i),
                   "trailing size " + std::to_string(i) + " of x is " +
                       std::to_string(x.size(lead + i)) + " but weight's is " +
                       std::to_string(w.size(i)));
  const int64_t d = w.numel();
  CUDA_EXT_CHECK(d > 0, "normalized shape must not be empty");
  const int64_t rows = x.numel() / d;

  cuda_ext::Tensor y = cuda_ext::empty_like(x);
  const int err = layer_norm_cpu(x.data_ptr<float>(), w.data_ptr<float>(), b.data_ptr<float>(),
                                 y.data_ptr<float>(), rows, d, static_cast<float>(eps));
  CUDA_EXT_CHECK(err == 0, "layer_norm_cpu failed with code " + std::to_string(err));
  return {y};
}

REGISTER_BINDING(layer_norm,
                 "layer_norm(x: Tensor[..., *S], weight: Tensor[*S], bias: Tensor[*S], eps: float)"
                 " -> Tensor",
                 layer_norm);
