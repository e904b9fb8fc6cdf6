// tensor_matmul_binding.cpp -- cuda_extension.tensor_matmul(A, B) = torch.matmul(A, B) for
// A of shape (..., K) with at least 2 dimensions and a matrix B of shape (K, N).
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "binding_registry.h"

extern "C" int tensor_matmul_launch(const float* A, const float* B, float* C, int64_t M,
                                    int64_t N, int64_t K, int config, cudaStream_t stream);

static cuda_ext::Outputs tensor_matmul(const cuda_ext::Args& args) {
  CUDA_EXT_CHECK(args.size() == 2 || args.size() == 3,
                 "tensor_matmul(A, B[, config]) takes 2 or 3 arguments");
  const cuda_ext::Tensor& a = args.tensor(0);
  const cuda_ext::Tensor& b = args.tensor(1);
  const int config = args.size() == 3 ? static_cast<int>(args.integer(2)) : 0;
  CUDA_EXT_CHECK(config >= 0 && config <= 4, "config must be 0..4");
  CUDA_EXT_CHECK(a.dtype == cuda_ext::DType::Float32 && b.dtype == cuda_ext::DType::Float32,
                 "A and B must be float32");
  CUDA_EXT_CHECK(a.is_cuda() && b.is_cuda(), "A and B must be CUDA tensors");
  CUDA_EXT_CHECK(a.device == b.device, "A and B must be on the same device");
  // (An empty tensor needs no layout; the header's is_contiguous rejects some of them.)
  CUDA_EXT_CHECK((a.numel() == 0 || a.is_contiguous()) && (b.numel() == 0 || b.is_contiguous()),
                 "A and B must be contiguous");
  CUDA_EXT_CHECK(a.dim() >= 2, "A must have at least 2 dimensions");
  CUDA_EXT_CHECK(b.dim() == 2, "B must be a matrix");
  const int64_t k = a.size(-1);
  CUDA_EXT_CHECK(b.size(0) == k, "A's last size is " + std::to_string(k) + " but B has " +
                                     std::to_string(b.size(0)) + " rows");
  const int64_t n = b.size(1);
  int64_t m = 1;
  std::vector<int64_t> out_sizes;
  for (int i = 0; i + 1 < a.dim(); ++i) {
    m *= a.size(i);
    out_sizes.push_back(a.size(i));
  }
  out_sizes.push_back(n);
  CUDA_EXT_CHECK(m <= 0x7fffffff && n <= 0x7fffffff && k <= 0x7fffffff,
                 "matrix sizes must fit in 32 bits");

  cuda_ext::Tensor c = cuda_ext::empty(out_sizes, cuda_ext::DType::Float32, a.device);
  if (m == 0 || n == 0) return {c};
  const int err = tensor_matmul_launch(a.data_ptr<float>(), b.data_ptr<float>(),
                                       c.data_ptr<float>(), m, n, k, config,
                                       static_cast<cudaStream_t>(cuda_ext::current_stream(a)));
  CUDA_EXT_CHECK(err == 0, std::string("tensor_matmul launch failed: ") +
                               cudaGetErrorString(static_cast<cudaError_t>(err)));
  return {c};
}

REGISTER_BINDING(tensor_matmul,
                 "tensor_matmul(A: Tensor[..., K], B: Tensor[K, N], config: int = 0)"
                 " -> Tensor[..., N]",
                 tensor_matmul);
