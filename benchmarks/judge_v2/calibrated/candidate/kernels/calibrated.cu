// calibrated.cu -- y = tanh(x) * 0.5 + x in one pass, after a tunable busy-wait.
//
// A benchmark fixture, not an optimisation. Every thread first spins `spin` SM clock cycles
// (clock64), then a grid-stride loop computes the element-wise function, with 16-byte
// streaming loads and stores when x and y are 16-byte aligned. The grid is at most one
// resident wave (SMs x kBlocksPerSm blocks of kThreads threads, which __launch_bounds__
// guarantees fit), so each thread spins once and the delay adds about spin / SM clock to the
// kernel time, almost linearly: a benchmark tunes `spin` to give the kernel an exact speed-up
// over eager PyTorch.
//
// Results equal PyTorch's tanh(x) * 0.5 + x: tanhf without fast-math is the same function
// PyTorch's tanh kernel calls, and the product by 0.5 is exact, so a fused multiply-add
// rounds the same way as the separate multiply and add.
#include <cuda_runtime.h>

#include <cstdint>

namespace {

constexpr int kThreads = 256;
constexpr int kBlocksPerSm = 8;
constexpr int kMaxDevices = 64;

__device__ __forceinline__ void spin_wait(long long cycles) {
  if (cycles <= 0) return;
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

__device__ __forceinline__ float apply(float v) { return tanhf(v) * 0.5f + v; }

template <bool kVec>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm)
calibrated_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n,
                  long long spin) {
  spin_wait(spin);
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  int64_t done = 0;
  if constexpr (kVec) {
    const int64_t n4 = n / 4;
    const float4* x4 = reinterpret_cast<const float4*>(x);
    float4* y4 = reinterpret_cast<float4*>(y);
    for (int64_t i = first; i < n4; i += stride) {
      const float4 v = __ldcs(x4 + i);
      __stcs(y4 + i, make_float4(apply(v.x), apply(v.y), apply(v.z), apply(v.w)));
    }
    done = n4 * 4;
  }
  for (int64_t i = done + first; i < n; i += stride) __stcs(y + i, apply(__ldcs(x + i)));
}

int sm_count(int device, int* out) {
  static int cache[kMaxDevices] = {0};
  if (device >= 0 && device < kMaxDevices && cache[device] > 0) {
    *out = cache[device];
    return 0;
  }
  int sms = 0;
  const cudaError_t err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess) return static_cast<int>(err);
  if (sms <= 0) sms = 1;
  if (device >= 0 && device < kMaxDevices) cache[device] = sms;
  *out = sms;
  return 0;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

// y[i] = tanh(x[i]) * 0.5 + x[i] for n floats on `device`, each thread first spinning `spin`
// clock cycles. Returns 0 or a cudaError_t.
extern "C" int calibrated_launch(const float* x, float* y, int64_t n, int64_t spin, int device,
                                 cudaStream_t stream) {
  if (n <= 0) return 0;
  if (spin < 0) return static_cast<int>(cudaErrorInvalidValue);
  int sms = 1;
  const int err = sm_count(device, &sms);
  if (err != 0) return err;
  const bool vec = aligned16(x) && aligned16(y);
  const int64_t work = vec ? (n / 4 > 0 ? n / 4 : n) : n;
  int64_t blocks = (work + kThreads - 1) / kThreads;
  const int64_t wave = static_cast<int64_t>(sms) * kBlocksPerSm;
  if (blocks > wave) blocks = wave;
  if (blocks < 1) blocks = 1;
  const auto grid = static_cast<unsigned>(blocks);
  const auto cycles = static_cast<long long>(spin);
  if (vec) {
    calibrated_kernel<true><<<grid, kThreads, 0, stream>>>(x, y, n, cycles);
  } else {
    calibrated_kernel<false><<<grid, kThreads, 0, stream>>>(x, y, n, cycles);
  }
  return static_cast<int>(cudaGetLastError());
}
