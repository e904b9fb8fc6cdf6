// judge_timer.cu -- the judge's device-wide "blocker" kernel. Trusted: the builder compiles
// this package copy (never a workspace copy) once per toolchain and links it into every
// cuda_extension module and into the tracer module; binding.cpp exposes it to Python as
// _block_device(ns), _gate_arm(ns, stream), _gate_open(), _gate_close(ns), _post_spread()
// and _blocker_info().
//
// The blocker occupies every thread slot of every SM for a given number of nanoseconds
// (measured with %globaltimer): blocks_per_sm x threads_per_block == the SM's thread limit,
// grid == SMs x blocks_per_sm. While it runs no block of any other kernel, on any stream,
// can start, so the judge can enqueue a candidate's work behind it (excluding host launch
// overhead) and see any work still running after the candidate's stream is done (it delays
// the next blocker).
//
// The gate (judge-v8) starts a timed call instead of a blocker on the calling stream: a
// holder kernel on the judge's own stream fills every SM; the calling stream waits (a stream
// memory operation, no kernel) until the holder has run `ns`, records the start event, then
// writes the value that releases the holder. The call's kernels, on the calling stream or
// any other, can start only once the holder's blocks see that write, after the start event.
// (Behind a kernel on the calling stream, the start event was recorded some 8 us after that
// kernel's blocks had freed the SMs: time in which a kernel queued on another stream ran.)
// Closing the gate queues blocker_post on the own stream, ordered after the calling stream
// by an event, so it reaches the dispatcher the moment the calling stream is done.
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
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

// blocker_post that also notes when its blocks started: the last block to start reports the
// first and the last start (`report`, host-mapped) and resets `arrivals` ({count, first}).
// Behind the calling stream, the spread of starts is the dispatch's own on an idle GPU; work
// that another stream is still running when the calling stream is done widens it, since the
// blocks of kernels launched earlier are dispatched first and the later blocks wait for SMs.
__global__ void __launch_bounds__(kMaxBlockThreads, 2) judge_post_kernel(
    unsigned long long ns, unsigned long long* arrivals, unsigned long long* report) {
  __shared__ unsigned long long start;
  if (threadIdx.x == 0) {
    start = global_ns();
    atomicMin(&arrivals[1], start);
    if (atomicAdd(&arrivals[0], 1ull) == gridDim.x - 1) {  // every block has started
      volatile unsigned long long* out = report;
      out[0] = atomicAdd(&arrivals[1], 0ull);
      out[1] = global_ns();
      arrivals[0] = 0;
      arrivals[1] = ~0ull;
      __threadfence_system();
    }
  }
  __syncthreads();
  while (global_ns() - start < ns) __nanosleep(128);
}

// The holder: every block holds its slots until `*release == ticket` (or `hold_max_ns` past
// `ns`, so that a lost release cannot hang the device); block 0 first waits `ns` from its
// start, then sets `*ready = ticket`, which the calling stream waits for.
__global__ void __launch_bounds__(kMaxBlockThreads, 2) judge_gate_kernel(
    unsigned long long ns, unsigned int ticket, unsigned int* ready,
    const unsigned int* release, unsigned long long hold_max_ns) {
  if (threadIdx.x == 0) {
    const unsigned long long start = global_ns();
    if (blockIdx.x == 0) {
      while (global_ns() - start < ns) __nanosleep(128);
      *reinterpret_cast<volatile unsigned int*>(ready) = ticket;
      __threadfence_system();
    }
    while (*reinterpret_cast<const volatile unsigned int*>(release) != ticket &&
           global_ns() - start < ns + hold_max_ns) {
      __nanosleep(64);
    }
  }
  __syncthreads();  // the other warps hold their slots here
}

constexpr unsigned long long kHoldMaxNs = 100000000ull;  // 100 ms
constexpr int kDriverError = 100000;  // + CUresult, for errors of the stream memory operations
constexpr int kNotArmed = 200000;
constexpr unsigned int kWaitValueEq = 0x1;  // CU_STREAM_WAIT_VALUE_EQ
constexpr unsigned int kWriteValueDefault = 0x0;  // CU_STREAM_WRITE_VALUE_DEFAULT

// cuStreamWaitValue32 / cuStreamWriteValue32 (driver API, from the libcuda already loaded)
typedef int (*StreamValueFn)(void* stream, unsigned long long address, unsigned int value,
                             unsigned int flags);

struct Driver {
  bool tried = false;
  StreamValueFn wait = nullptr;
  StreamValueFn write = nullptr;
};

StreamValueFn driver_fn(void* lib, const char* name) {
  char versioned[64];
  snprintf(versioned, sizeof(versioned), "%s_v2", name);
  void* fn = dlsym(lib, versioned);
  return reinterpret_cast<StreamValueFn>(fn ? fn : dlsym(lib, name));
}

struct Config {
  bool ready = false;
  int threads = 0;        // per block
  int blocks_per_sm = 0;  // blocks of `threads` that fill an SM's thread slots
  int sms = 0;
  int resident = 0;       // blocks per SM the occupancy calculator says fit
  bool full = false;
  unsigned int* flags = nullptr;  // device memory: {ready, release}
  unsigned long long* arrivals = nullptr;  // device memory: judge_post_kernel's {count, first}
  unsigned long long* report = nullptr;    // host-mapped: {first start, last start}
  unsigned long long* report_dev = nullptr;
  unsigned int ticket = 0;        // the last armed gate's
  unsigned int armed = 0;         // the gate armed and not yet opened (0: none)
  void* armed_stream = nullptr;   // the calling stream it was armed on
  void* own_stream = nullptr;     // and the holder's stream
};

constexpr int kMaxDevices = 64;
std::mutex config_mutex;
Config configs[kMaxDevices];
Driver driver;  // under config_mutex

// Whether the gate can work: the driver's stream memory operations and the flag words.
bool gate_ready(Config& c) {
  if (!driver.tried) {
    driver.tried = true;
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (lib == nullptr) lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (lib != nullptr) {
      driver.wait = driver_fn(lib, "cuStreamWaitValue32");
      driver.write = driver_fn(lib, "cuStreamWriteValue32");
    }
  }
  if (driver.wait == nullptr || driver.write == nullptr) return false;
  if (c.flags == nullptr) {
    void* flags = nullptr;
    void* arrivals = nullptr;
    void* report = nullptr;
    void* report_dev = nullptr;
    const unsigned long long initial[2] = {0, ~0ull};
    bool ok = cudaMalloc(&flags, 2 * sizeof(unsigned int)) == cudaSuccess &&
              cudaMemset(flags, 0, 2 * sizeof(unsigned int)) == cudaSuccess &&
              cudaMalloc(&arrivals, sizeof(initial)) == cudaSuccess &&
              cudaMemcpy(arrivals, initial, sizeof(initial), cudaMemcpyHostToDevice) ==
                  cudaSuccess &&
              cudaHostAlloc(&report, 2 * sizeof(unsigned long long), cudaHostAllocMapped) ==
                  cudaSuccess &&
              cudaHostGetDevicePointer(&report_dev, report, 0) == cudaSuccess &&
              cudaDeviceSynchronize() == cudaSuccess;
    if (!ok) {
      if (flags) cudaFree(flags);
      if (arrivals) cudaFree(arrivals);
      if (report) cudaFreeHost(report);
      cudaGetLastError();  // clear it: the plain blocker still works
      return false;
    }
    c.flags = static_cast<unsigned int*>(flags);
    c.arrivals = static_cast<unsigned long long*>(arrivals);
    c.report = static_cast<unsigned long long*>(report);
    c.report_dev = static_cast<unsigned long long*>(report_dev);
  }
  return true;
}

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

// The current device and its launch configuration.
cudaError_t current_config(int* device, Config* out) {
  cudaError_t err = cudaGetDevice(device);
  return err == cudaSuccess ? config_for(*device, out) : err;
}

}  // namespace

// Fill the current device's SMs for `ns` nanoseconds on `stream` (a cudaStream_t).
JUDGE_TIMER_API int cuda_agent_judge_block_device(unsigned long long ns, void* stream) {
  int device = 0;
  Config c;
  cudaError_t err = current_config(&device, &c);
  if (err != cudaSuccess) return static_cast<int>(err);
  judge_block_kernel<<<c.sms * c.blocks_per_sm, c.threads, 0,
                       static_cast<cudaStream_t>(stream)>>>(ns);
  return static_cast<int>(cudaGetLastError());
}

// Arm the gate: the holder for `ns` on `own_stream`; `call_stream` waits until it has run.
// Record the start event on `call_stream` next, then cuda_agent_judge_gate_open.
JUDGE_TIMER_API int cuda_agent_judge_gate_arm(unsigned long long ns, void* own_stream,
                                              void* call_stream) {
  int device = 0;
  Config c;
  cudaError_t err = current_config(&device, &c);
  if (err != cudaSuccess) return static_cast<int>(err);
  std::lock_guard<std::mutex> lock(config_mutex);
  Config& live = configs[device];
  if (!gate_ready(live)) return kDriverError;
  unsigned int ticket = ++live.ticket;
  if (ticket == 0) ticket = ++live.ticket;  // the flags start at 0
  judge_gate_kernel<<<c.sms * c.blocks_per_sm, c.threads, 0,
                      static_cast<cudaStream_t>(own_stream)>>>(ns, ticket, live.flags,
                                                               live.flags + 1, kHoldMaxNs);
  err = cudaGetLastError();
  if (err != cudaSuccess) return static_cast<int>(err);
  const int waited = driver.wait(call_stream, reinterpret_cast<unsigned long long>(live.flags),
                                 ticket, kWaitValueEq);
  if (waited != 0) return kDriverError + waited;
  live.armed = ticket;
  live.armed_stream = call_stream;
  live.own_stream = own_stream;
  return 0;
}

// Open the armed gate: the calling stream it was armed on releases the holder.
JUDGE_TIMER_API int cuda_agent_judge_gate_open() {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return static_cast<int>(err);
  if (device < 0 || device >= kMaxDevices) return static_cast<int>(cudaErrorInvalidDevice);
  std::lock_guard<std::mutex> lock(config_mutex);
  Config& live = configs[device];
  if (live.armed == 0) return kNotArmed;
  const int wrote = driver.write(live.armed_stream,
                                 reinterpret_cast<unsigned long long>(live.flags + 1),
                                 live.armed, kWriteValueDefault);
  return wrote == 0 ? 0 : kDriverError + wrote;
}

// Close the gate: blocker_post noting its block starts (judge_post_kernel) for `ns` on the
// holder's stream, which the caller has made wait for the calling stream (an event recorded
// there after the call). The post reaches the dispatcher as soon as the calling stream is
// done, behind the blocks of every kernel launched before it, so work still running on any
// other stream delays it and widens its spread. Record the end event on the own stream next.
JUDGE_TIMER_API int cuda_agent_judge_gate_close(unsigned long long ns) {
  int device = 0;
  Config c;
  cudaError_t err = current_config(&device, &c);
  if (err != cudaSuccess) return static_cast<int>(err);
  std::lock_guard<std::mutex> lock(config_mutex);
  Config& live = configs[device];
  if (live.armed == 0) return kNotArmed;
  live.armed = 0;
  live.report[0] = live.report[1] = 0;  // the GPU is idle here: the judge synchronised
  judge_post_kernel<<<c.sms * c.blocks_per_sm, c.threads, 0,
                      static_cast<cudaStream_t>(live.own_stream)>>>(ns, live.arrivals,
                                                                    live.report_dev);
  return static_cast<int>(cudaGetLastError());
}

// The spread (last - first) of the last judge_post_kernel's block starts, in ns, once it has
// finished; -1 if it reported none.
JUDGE_TIMER_API int cuda_agent_judge_post_spread(long long* out) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return static_cast<int>(err);
  if (device < 0 || device >= kMaxDevices) return static_cast<int>(cudaErrorInvalidDevice);
  std::lock_guard<std::mutex> lock(config_mutex);
  const Config& live = configs[device];
  const volatile unsigned long long* report = live.report;
  if (report == nullptr || report[1] == 0) {
    *out = -1;
  } else {
    *out = static_cast<long long>(report[1] - report[0]);
  }
  return 0;
}

// The launch shape on the current device and whether the gate works there:
// {threads, blocks_per_sm, sms, resident, full, gate}.
JUDGE_TIMER_API int cuda_agent_judge_blocker_info(int* values) {
  int device = 0;
  Config c;
  cudaError_t err = current_config(&device, &c);
  if (err != cudaSuccess) return static_cast<int>(err);
  values[0] = c.threads;
  values[1] = c.blocks_per_sm;
  values[2] = c.sms;
  values[3] = c.resident;
  values[4] = c.full ? 1 : 0;
  std::lock_guard<std::mutex> lock(config_mutex);
  values[5] = gate_ready(configs[device]) ? 1 : 0;
  return 0;
}

JUDGE_TIMER_API const char* cuda_agent_judge_error(int code) {
  if (code == kNotArmed) return "the gate was opened without being armed";
  if (code >= kDriverError)
    return "the CUDA driver's stream memory operations (cuStreamWaitValue32, "
           "cuStreamWriteValue32) are unavailable or failed";
  return cudaGetErrorString(static_cast<cudaError_t>(code));
}
