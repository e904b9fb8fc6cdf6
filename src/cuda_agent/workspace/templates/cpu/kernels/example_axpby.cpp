// example_axpby.cpp -- a complete, working example of the kernel side of the contract.
//
// On the CPU target every kernels/*.cpp is compiled by g++ with -O3 -march=native -fopenmp.
// A kernel file holds plain C++ (OpenMP for threads, simple inner loops the compiler can
// vectorise) and one extern "C" launcher that takes plain pointers, sizes and a config int
// (free for your own tuning choices). The matching kernels/example_axpby_binding.cpp checks
// the arguments, allocates the output and calls the launcher. Keep this pair as a
// reference or delete both files.
//
// Computes out[i] = a * x[i] + b * y[i] over n contiguous float32 elements.
#include <cstdint>

// config: unused here; 0 is the default everywhere.
extern "C" void example_axpby_launch(const float* __restrict__ x, const float* __restrict__ y,
                                     float* __restrict__ out, int64_t n, float a, float b,
                                     int config) {
  (void)config;
  // Threads only pay off once there is enough work to cover the fork/join cost.
#pragma omp parallel for simd schedule(static) if (n >= (int64_t{1} << 15))
  for (int64_t i = 0; i < n; ++i) out[i] = a * x[i] + b * y[i];
}
