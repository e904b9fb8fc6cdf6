// layer_norm_binding.cpp -- cuda_extension.layer_norm(x, weight, bias, eps[, config]).
//
// Normalises over the trailing weight.dim() dimensions of x, whose sizes must equal
// weight's (torch.nn.LayerNorm with elementwise_affine=True).
#include <cuda_runtime.h>

#include <string>

#include "binding_registry.h"

extern "C" int64_t layer_norm_workspace_floats(int64_t rows, int64_t d, int config);
extern "C" int layer_norm_launch(const float* x, const float* w, const float* b, float* y,
                                 float* workspace, int64_t rows, int64_t d, float eps, int config,
                                 cudaStream_t stream);

static cuda_ext::Outputs layer_norm(const cuda_ext::Args& args) {
  CUDA_EXT_CHECK(args.size() == 4 || args.size() == 5,
                 "layer_norm(x, weight, bias, eps[, config]) takes 4 or 5 arguments");
  const cuda_ext::Tensor& x = args.tensor(0);
  const cuda_ext::Tensor& w = args.tensor(1);
  const cuda_ext::Tensor& b = args.tensor(2);
  const double eps = args.real(3);
  const int config = args.size() == 5 ? static_cast<int>(args.integer(4)) : 0;
  CUDA_EXT_CHECK(config >= 0 && config <= 3, "config must be 0..3");
  CUDA_EXT_CHECK(eps >= 0.0, "eps must be non-negative");
  for (const cuda_ext::Tensor* t : {&x, &w, &b}) {
    CUDA_EXT_CHECK(t->dtype == cuda_ext::DType::Float32, "x, weight and bias must be float32");
    CUDA_EXT_CHECK(t->is_cuda(), "x, weight and bias must be CUDA tensors");
    CUDA_EXT_CHECK(t->device == x.device, "x, weight and bias must be on one device");
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
  CUDA_EXT_CHECK(d <= 0x7fffffff, "normalized size must fit in 32 bits");
  CUDA_EXT_CHECK(config != 2 || d <= 8192, "config 2 (row path) needs d <= 8192");
  const int64_t rows = x.numel() / d;

  cuda_ext::Tensor y = cuda_ext::empty_like(x);
  if (rows == 0) return {y};
  const int64_t ws_floats = layer_norm_workspace_floats(rows, d, config);
  cuda_ext::Tensor ws;
  if (ws_floats > 0) ws = cuda_ext::empty({ws_floats}, cuda_ext::DType::Float32, x.device);
  const int err = layer_norm_launch(
      x.data_ptr<float>(), w.data_ptr<float>(), b.data_ptr<float>(), y.data_ptr<float>(),
      ws_floats > 0 ? ws.data_ptr<float>() : nullptr, rows, d, static_cast<float>(eps), config,
      static_cast<cudaStream_t>(cuda_ext::current_stream(x)));
  CUDA_EXT_CHECK(err == 0, std::string("layer_norm launch failed: ") +
                               cudaGetErrorString(static_cast<cudaError_t>(err)));
  return {y};
}

REGISTER_BINDING(layer_norm,
                 "layer_norm(x: Tensor[..., *S], weight: Tensor[*S], bias: Tensor[*S], eps: float,"
                 " config: int = 0) -> Tensor",
                 layer_norm);
