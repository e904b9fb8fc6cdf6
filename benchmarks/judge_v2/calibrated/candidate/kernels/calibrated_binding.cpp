// calibrated_binding.cpp -- cuda_extension.calibrated(x, spin[, mode]): y = tanh(x) * 0.5 + x.
//
// x: a contiguous float32 CUDA tensor of any shape; spin: the delay each thread of the kernel
// takes before its work (0 for none; at most 2^26): with mode 0 (the default) clock cycles
// (2^26 is about 35 ms at 1.9 GHz), with mode 1 sixteenths of a 16-byte load per thread,
// streamed from a scratch buffer.
#include <cuda_runtime.h>

#include <string>

#include "binding_registry.h"

extern "C" int calibrated_launch(const float* x, float* y, int64_t n, int64_t spin, int mode,
                                 int device, cudaStream_t stream);

namespace {
constexpr int64_t kMaxSpin = int64_t{1} << 26;
}

static cuda_ext::Outputs calibrated(const cuda_ext::Args& args) {
  CUDA_EXT_CHECK(args.size() == 2 || args.size() == 3,
                 "calibrated(x, spin[, mode]) takes 2 or 3 arguments");
  const cuda_ext::Tensor& x = args.tensor(0);
  const int64_t spin = args.integer(1);
  const int64_t mode = args.size() == 3 ? args.integer(2) : 0;
  CUDA_EXT_CHECK(mode == 0 || mode == 1,
                 "mode must be 0 (clock cycles) or 1 (streamed loads), got " +
                     std::to_string(mode));
  CUDA_EXT_CHECK(x.dtype == cuda_ext::DType::Float32, "x must be float32");
  CUDA_EXT_CHECK(x.is_cuda(), "x must be a CUDA tensor");
  CUDA_EXT_CHECK(x.is_contiguous(), "x must be contiguous");
  CUDA_EXT_CHECK(spin >= 0 && spin <= kMaxSpin,
                 "spin must be in [0, " + std::to_string(kMaxSpin) + "], got " +
                     std::to_string(spin));
  cuda_ext::Tensor y = cuda_ext::empty_like(x);
  const int64_t n = x.numel();
  if (n == 0) return {y};
  const int err = calibrated_launch(x.data_ptr<float>(), y.data_ptr<float>(), n, spin,
                                    static_cast<int>(mode), x.device,
                                    static_cast<cudaStream_t>(cuda_ext::current_stream(x)));
  CUDA_EXT_CHECK(err == 0, std::string("calibrated launch failed: ") +
                               cudaGetErrorString(static_cast<cudaError_t>(err)));
  return {y};
}

REGISTER_BINDING(calibrated, "calibrated(x: Tensor, spin: int, mode: int = 0) -> Tensor",
                 calibrated);
