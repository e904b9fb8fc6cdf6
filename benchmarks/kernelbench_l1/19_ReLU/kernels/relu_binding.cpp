// relu_binding.cpp -- cuda_extension.relu(x) -> max(x, 0) for float32 CUDA tensors.
#include <cuda_runtime.h>

#include <string>

#include "binding_registry.h"

extern "C" int relu_launch(const float* x, float* y, int64_t n, int sms, cudaStream_t stream);

static cuda_ext::Outputs relu(const cuda_ext::Args& args) {
  CUDA_EXT_CHECK(args.size() == 1, "relu(x) takes 1 argument");
  const cuda_ext::Tensor& x = args.tensor(0);
  CUDA_EXT_CHECK(x.dtype == cuda_ext::DType::Float32, "x must be float32");
  CUDA_EXT_CHECK(x.is_cuda(), "x must be a CUDA tensor");
  CUDA_EXT_CHECK(x.numel() == 0 || x.is_contiguous(), "x must be contiguous");
  cuda_ext::Tensor y = cuda_ext::empty_like(x);
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, x.device);
  const int err = relu_launch(x.data_ptr<float>(), y.data_ptr<float>(), x.numel(),
                              sms > 0 ? sms : 132,
                              static_cast<cudaStream_t>(cuda_ext::current_stream(x)));
  CUDA_EXT_CHECK(err == 0, std::string("relu launch failed: ") +
                               cudaGetErrorString(static_cast<cudaError_t>(err)));
  return {y};
}

REGISTER_BINDING(relu, "relu(x: Tensor) -> Tensor", relu);
