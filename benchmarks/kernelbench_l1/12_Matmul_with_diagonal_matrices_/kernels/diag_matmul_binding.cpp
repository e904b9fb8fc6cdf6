// diag_matmul_binding.cpp -- cuda_extension.diag_matmul(a, B) -> diag(a) @ B.
#include <cuda_runtime.h>

#include <string>

#include "binding_registry.h"

extern "C" int diag_matmul_launch(const float* a, const float* b, float* c, int64_t rows,
                                  int64_t cols, int config, cudaStream_t stream);

static cuda_ext::Outputs diag_matmul(const cuda_ext::Args& args) {
  CUDA_EXT_CHECK(args.size() == 2 || args.size() == 3,
                 "diag_matmul(a, B[, config]) takes 2 or 3 arguments");
  const cuda_ext::Tensor& a = args.tensor(0);
  const cuda_ext::Tensor& b = args.tensor(1);
  const int config = args.size() == 3 ? static_cast<int>(args.integer(2)) : 0;
  CUDA_EXT_CHECK(a.dtype == cuda_ext::DType::Float32, "a must be float32");
  CUDA_EXT_CHECK(b.dtype == cuda_ext::DType::Float32, "B must be float32");
  CUDA_EXT_CHECK(a.is_cuda() && b.is_cuda(), "a and B must be CUDA tensors");
  CUDA_EXT_CHECK(a.device == b.device, "a and B must be on the same device");
  CUDA_EXT_CHECK(a.dim() == 1, "a must be 1-D (the diagonal)");
  CUDA_EXT_CHECK(b.dim() == 2, "B must be 2-D");
  CUDA_EXT_CHECK(a.size(0) == b.size(0),
                 "a has " + std::to_string(a.size(0)) + " elements but B has " +
                     std::to_string(b.size(0)) + " rows");
  // (An empty tensor needs no layout; the header's is_contiguous rejects some of them.)
  CUDA_EXT_CHECK((a.numel() == 0 || a.is_contiguous()) && (b.numel() == 0 || b.is_contiguous()),
                 "a and B must be contiguous");

  cuda_ext::Tensor c = cuda_ext::empty({b.size(0), b.size(1)}, cuda_ext::DType::Float32, b.device);
  const int err = diag_matmul_launch(a.data_ptr<float>(), b.data_ptr<float>(), c.data_ptr<float>(),
                                     b.size(0), b.size(1), config,
                                     static_cast<cudaStream_t>(cuda_ext::current_stream(b)));
  CUDA_EXT_CHECK(err == 0, std::string("diag_matmul launch failed: ") +
                               cudaGetErrorString(static_cast<cudaError_t>(err)));
  return {c};
}

REGISTER_BINDING(diag_matmul, "diag_matmul(a: Tensor[N], B: Tensor[N, M], config: int = 0) -> Tensor[N, M]",
                 diag_matmul);
