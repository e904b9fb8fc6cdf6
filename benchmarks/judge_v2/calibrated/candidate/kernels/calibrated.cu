// calibrated.cu -- y = tanh(x) * 0.5 + x in one pass, after a tunable delay.
//
// A benchmark fixture, not an optimisation. Before its share of the work every thread
// either spins `delay` SM clock cycles (clock64; mode 0), or streams delay / 16 16-byte loads
// from a 512 MiB scratch buffer of zeros (mode 1; delay % 16 of every 16 threads load once
// more, so that one unit is 1/16 of a load per thread). Then a grid-stride loop computes the
// element-wise function, with 16-byte streaming loads and stores when x and y are 16-byte
// aligned. The grid is at most one resident wave (SMs x kBlocksPerSm blocks of kThreads
// threads, which __launch_bounds__ guarantees fit), so each thread delays once and the delay
// adds to the kernel time almost linearly: a benchmark tunes `delay` to give the kernel an
// exact speed-up over eager PyTorch. A spin follows the SM clock; streamed loads follow the
// memory system, as eager PyTorch's element-wise kernels do.
//
// Results equal PyTorch's tanh(x) * 0.5 + x: tanhf without fast-math is the same function
// PyTorch's tanh kernel calls, and the product by 0.5 is exact, so a fused multiply-add
// rounds the same way as the separate multiply and add. The streamed zeros never reach y.
#include <cuda_runtime.h>

#include <cstdint>

namespace {

constexpr int kThreads = 256;
constexpr int kBlocksPerSm = 8;
constexpr int kMaxDevices = 64;
constexpr int64_t kScratchVec4 = (int64_t{512} << 20) / 16;  // 512 MiB of float4 zeros

__device__ __forceinline__ void spin_wait(long long cycles) {
  if (cycles <= 0) return;
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

// units / 16 coalesced 16-byte streaming loads per thread from `scratch` (zeros), and one
// more in units % 16 of every 16 threads, wrapping around the buffer; their sum is zero, so
// the store it guards never happens, but the compiler cannot drop the loads.
__device__ __forceinline__ void stream_wait(const float4* __restrict__ scratch, long long units,
                                            float* __restrict__ y) {
  if (units <= 0 || scratch == nullptr) return;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t threads = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const long long steps = units / 16 + ((tid % 16) < (units % 16) ? 1 : 0);
  float acc = 0.0f;
  int64_t i = tid % kScratchVec4;
  for (long long s = 0; s < steps; ++s) {
    const float4 v = __ldcs(scratch + i);
    acc += (v.x + v.y) + (v.z + v.w);
    i += threads;
    if (i >= kScratchVec4) i -= kScratchVec4;  // threads < kScratchVec4: one subtraction
  }
  if (acc == 1.0e30f) y[0] = acc;
}

__device__ __forceinline__ float apply(float v) { return tanhf(v) * 0.5f + v; }

template <bool kVec>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm)
calibrated_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n,
                  long long spin, const float4* __restrict__ scratch) {
  if (scratch != nullptr) {
    stream_wait(scratch, spin, y);
  } else {
    spin_wait(spin);
  }
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

// The device's scratch buffer of zeros, allocated at its first use (kept for the process).
int scratch_of(int device, const float4** out) {
  static float4* cache[kMaxDevices] = {nullptr};
  if (device < 0 || device >= kMaxDevices) return static_cast<int>(cudaErrorInvalidDevice);
  if (cache[device] == nullptr) {
    void* p = nullptr;
    cudaError_t err = cudaMalloc(&p, kScratchVec4 * sizeof(float4));
    if (err != cudaSuccess) return static_cast<int>(err);
    err = cudaMemset(p, 0, kScratchVec4 * sizeof(float4));
    if (err == cudaSuccess) err = cudaDeviceSynchronize();
    if (err != cudaSuccess) {
      cudaFree(p);
      return static_cast<int>(err);
    }
    cache[device] = static_cast<float4*>(p);
  }
  *out = cache[device];
  return 0;
}

}  // namespace

// y[i] = tanh(x[i]) * 0.5 + x[i] for n floats on `device`, each thread first spinning `spin`
// clock cycles (mode 0) or streaming spin / 16 16-byte loads of scratch (mode 1). Returns 0 or a
// cudaError_t.
extern "C" int calibrated_launch(const float* x, float* y, int64_t n, int64_t spin, int mode,
                                 int device, cudaStream_t stream) {
  if (n <= 0) return 0;
  if (spin < 0 || mode < 0 || mode > 1) return static_cast<int>(cudaErrorInvalidValue);
  int sms = 1;
  int err = sm_count(device, &sms);
  if (err != 0) return err;
  const float4* scratch = nullptr;
  if (mode == 1 && spin > 0) {
    err = scratch_of(device, &scratch);
    if (err != 0) return err;
  }
  const bool vec = aligned16(x) && aligned16(y);
  const int64_t work = vec ? (n / 4 > 0 ? n / 4 : n) : n;
  int64_t blocks = (work + kThreads - 1) / kThreads;
  const int64_t wave = static_cast<int64_t>(sms) * kBlocksPerSm;
  if (blocks > wave) blocks = wave;
  if (blocks < 1) blocks = 1;
  const auto grid = static_cast<unsigned>(blocks);
  const auto cycles = static_cast<long long>(spin);
  if (vec) {
    calibrated_kernel<true><<<grid, kThreads, 0, stream>>>(x, y, n, cycles, scratch);
  } else {
    calibrated_kernel<false><<<grid, kThreads, 0, stream>>>(x, y, n, cycles, scratch);
  }
  return static_cast<int>(cudaGetLastError());
}
