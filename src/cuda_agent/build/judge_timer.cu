// judge_timer.cu -- the judge's device-wide "blocker" kernel. Trusted: the builder compiles
// this package copy (never a workspace copy) once per toolchain and links it into every
// cuda_extension module and into the tracer module; binding.cpp exposes it to Python as
// _block_device(ns) and _blocker_info().
//
// The blocker occupies every thread slot of every SM for a given number of nanoseconds
// (measured with %globaltimer): blocks_per_sm x threads_per_block == the SM's thread limit,
// grid == SMs x blocks_per_sm. While it runs no block of any other kernel, on any stream,
// can start, so the judge can enqueue a candidate's work behind it (excluding host launch
// overhead) and see any work still running after the candidate's stream is done (it delays
// the next blocker).
#include <cuda_runtime.h>

#include <cstdint>
#include <mutex>

// Hidden: binding.cpp reaches these inside the module; nothing outside can interpose them.
#define JUDGE_TIMER_API extern "C" __attribute__((visibility("hidden")))

namespace {

constexpr int kMaxBlockThreads = 1024;

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Two blocks of up to 1024 threads per SM need <= 32 registers per thread; the loop uses few.
__global__ void __launch_bounds__(kMaxBlockThreads, 2) judge_block_kernel(
    unsigned long long ns) {
  const unsigned long long start = global_ns();
  while (global_ns() - start < ns) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
    __nanosleep(128);  // hold the slot without competing for issue slots (or power)
#endif
  }
}

struct Config {
  bool ready = false;
  int threads = 0;        // per block
  int blocks_per_sm = 0;  // blocks of `threads` that fill an SM's thread slots
  int sms = 0;
  int resident = 0;       // blocks per SM the occupancy calculator says fit
  bool full = false;
};

constexpr int kMaxDevices = 64;
std::mutex config_mutex;
Config configs[kMaxDevices];

cudaError_t config_for(int device, Config* out) {
  if (device < 0 || device >= kMaxDevices) return cudaErrorInvalidDevice;
  std::lock_guard<std::mutex> lock(config_mutex);
  Config& c = configs[device];
  if (!c.ready) {
    int per_sm = 0, per_block = 0, sms = 0;
    cudaError_t err = cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxThreadsPerMultiProcessor,
                                             device);
    if (err == cudaSuccess)
      err = cudaDeviceGetAttribute(&per_block, cudaDevAttrMaxThreadsPerBlock, device);
    if (err == cudaSuccess)
      err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    if (err != cudaSuccess) return err;
    int threads = per_block < kMaxBlockThreads ? per_block : kMaxBlockThreads;
    threads -= threads % 32;
    while (threads > 32 && per_sm % threads != 0) threads -= 32;
    c.threads = threads;
    c.blocks_per_sm = threads > 0 ? per_sm / threads : 0;
    c.sms = sms;
    err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&c.resident, judge_block_kernel,
                                                        threads, 0);
    if (err != cudaSuccess) return err;
    c.full = threads > 0 && c.blocks_per_sm * threads == per_sm &&
             c.resident >= c.blocks_per_sm && sms > 0;
    c.ready = true;
  }
  *out = c;
  return cudaSuccess;
}

}  // namespace

// Fill the current device's SMs for `ns` nanoseconds on `stream` (a cudaStream_t).
JUDGE_TIMER_API int cuda_agent_judge_block_device(unsigned long long ns, void* stream) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  Config c;
  if (err == cudaSuccess) err = config_for(device, &c);
  if (err != cudaSuccess) return static_cast<int>(err);
  judge_block_kernel<<<c.sms * c.blocks_per_sm, c.threads, 0,
                       static_cast<cudaStream_t>(stream)>>>(ns);
  return static_cast<int>(cudaGetLastError());
}

// The launch shape on the current device: {threads, blocks_per_sm, sms, resident, full}.
JUDGE_TIMER_API int cuda_agent_judge_blocker_info(int* values) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  Config c;
  if (err == cudaSuccess) err = config_for(device, &c);
  if (err != cudaSuccess) return static_cast<int>(err);
  values[0] = c.threads;
  values[1] = c.blocks_per_sm;
  values[2] = c.sms;
  values[3] = c.resident;
  values[4] = c.full ? 1 : 0;
  return 0;
}

JUDGE_TIMER_API const char* cuda_agent_judge_error(int code) {
  return cudaGetErrorString(static_cast<cudaError_t>(code));
}
