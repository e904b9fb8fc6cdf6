// example_axpby.cu -- a complete, working example of the kernel side of the contract.
//
// Files named kernels/*.cu are compiled by nvcc WITHOUT torch headers: they hold raw
// __global__ kernels plus one extern "C" launcher that takes plain pointers, sizes, a
// config int (free for your own tuning choices) and the cudaStream_t to launch on. The
// matching kernels/example_axpby_binding.cpp checks the arguments, allocates the output
// and calls the launcher. Keep this pair as a reference or delete both files.
//
// Computes out[i] = a * x[i] + b * y[i] over n contiguous float32 elements.
#include <cuda_runtime.h>

#include <cstdint>

namespace {

__global__ void axpby_kernel(const float* __restrict__ x, const float* __restrict__ y,
                             float* __restrict__ out, int64_t n, float a, float b) {
  // Grid-stride loop: any grid size covers all n elements, each written exactly once.
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    out[i] = a * x[i] + b * y[i];
  }
}

}  // namespace

// config: threads per block (a multiple of 32, at most 1024); 0 picks 256.
extern "C" void example_axpby_launch(const float* x, const float* y, float* out, int64_t n,
                                     float a, float b, int config, cudaStream_t stream) {
  if (n <= 0) return;
  const int threads = (config >= 32 && config <= 1024 && config % 32 == 0) ? config : 256;
  int device = 0;
  int sms = 1;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  // Enough blocks to fill every SM several times over; the loop handles the rest.
  const int64_t wanted = (n + threads - 1) / threads;
  const int64_t cap = static_cast<int64_t>(sms) * 8;
  const int blocks = static_cast<int>(wanted < cap ? wanted : cap);
  axpby_kernel<<<blocks, threads, 0, stream>>>(x, y, out, n, a, b);
}
