// example_axpby_binding.cpp -- the binding side of the contract, paired with example_axpby.cpp.
//
// Files named kernels/*_binding.cpp include only "binding_registry.h". A binding validates
// its arguments, allocates outputs with cuda_ext::empty / empty_like, calls the launcher
// and registers itself with REGISTER_BINDING. From Python:
//
//   import cuda_extension
//   out = cuda_extension.example_axpby(x, y, 2.0, -1.0)   # out = 2 * x - y
#include <cstdint>

#include "binding_registry.h"

extern "C" void example_axpby_launch(const float* x, const float* y, float* out, int64_t n,
                                     float a, float b, int config);

namespace {

cuda_ext::Outputs example_axpby(const cuda_ext::Args& args) {
  const cuda_ext::Tensor& x = args.tensor(0);
  const cuda_ext::Tensor& y = args.tensor(1);
  const float a = static_cast<float>(args.real(2));
  const float b = static_cast<float>(args.real(3));
  CUDA_EXT_CHECK(!x.is_cuda() && !y.is_cuda(), "x and y must be CPU tensors");
  CUDA_EXT_CHECK(x.dtype == cuda_ext::DType::Float32, "x must be float32");
  CUDA_EXT_CHECK(y.dtype == cuda_ext::DType::Float32, "y must be float32");
  CUDA_EXT_CHECK(x.sizes == y.sizes, "x and y must have the same sizes");
  CUDA_EXT_CHECK(x.is_contiguous() && y.is_contiguous(), "x and y must be contiguous");

  cuda_ext::Tensor out = cuda_ext::empty_like(x);
  example_axpby_launch(x.data_ptr<float>(), y.data_ptr<float>(), out.data_ptr<float>(),
                       x.numel(), a, b, /*config=*/0);
  return {out};
}

}  // namespace

REGISTER_BINDING(example_axpby, "example_axpby(x: Tensor, y: Tensor, a: float, b: float) -> Tensor",
                 example_axpby);
