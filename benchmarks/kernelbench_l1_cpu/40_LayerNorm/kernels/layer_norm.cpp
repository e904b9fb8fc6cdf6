// layer_norm.cpp -- CPU twin of the CUDA LayerNorm: y = (x - mean) / sqrt(var + eps) * w + b
// over the last d elements of x, with OpenMP threads.
//
// Same decomposition as the GPU version, so long rows (few rows, millions of elements)
// still use every core: each row is cut into kChunk-element chunks.
//   1. every (row, chunk) computes its mean and M2 (sum of squared deviations) exactly,
//      two passes over a chunk that stays in cache, accumulating in double;
//   2. every row merges its chunks in a fixed order with Chan's formula (double);
//   3. every (row, chunk) writes y = (x - mean) * rstd * w + b, a loop the compiler
//      vectorises.
// Results do not depend on the number of threads.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace {

constexpr int64_t kChunk = 8192;

struct Moments {
  double n = 0.0, mean = 0.0, m2 = 0.0;
};

void merge(Moments& a, const Moments& b) {
  const double n = a.n + b.n;
  if (n == 0.0) return;
  const double delta = b.mean - a.mean;
  a.mean += delta * (b.n / n);
  a.m2 += b.m2 + delta * delta * (a.n * b.n / n);
  a.n = n;
}

Moments chunk_moments(const float* x, int64_t count) {
  double sum = 0.0;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < count; ++i) sum += x[i];
  const double mean = sum / static_cast<double>(count);
  double m2 = 0.0;
#pragma omp simd reduction(+ : m2)
  for (int64_t i = 0; i < count; ++i) {
    const double dev = static_cast<double>(x[i]) - mean;
    m2 += dev * dev;
  }
  return {static_cast<double>(count), mean, m2};
}

}  // namespace

// Returns 0 on success.
extern "C" int layer_norm_cpu(const float* x, const float* w, const float* b, float* y,
                              int64_t rows, int64_t d, float eps) {
  if (rows <= 0 || d <= 0) return 0;
  const int64_t nchunks = (d + kChunk - 1) / kChunk;
  const int64_t items = rows * nchunks;
  std::vector<Moments> part(static_cast<size_t>(items));
  std::vector<float> mean(static_cast<size_t>(rows)), rstd(static_cast<size_t>(rows));

#pragma omp parallel
  {
#pragma omp for schedule(static)
    for (int64_t it = 0; it < items; ++it) {
      const int64_t row = it / nchunks, chunk = it % nchunks;
      const int64_t begin = chunk * kChunk;
      part[static_cast<size_t>(it)] =
          chunk_moments(x + row * d + begin, std::min(kChunk, d - begin));
    }
#pragma omp for schedule(static)
    for (int64_t row = 0; row < rows; ++row) {
      Moments total;
      for (int64_t c = 0; c < nchunks; ++c) merge(total, part[static_cast<size_t>(row * nchunks + c)]);
      const double var = total.m2 / static_cast<double>(d);
      mean[static_cast<size_t>(row)] = static_cast<float>(total.mean);
      rstd[static_cast<size_t>(row)] =
          static_cast<float>(1.0 / std::sqrt(var + static_cast<double>(eps)));
    }
#pragma omp for schedule(static)
    for (int64_t it = 0; it < items; ++it) {
      const int64_t row = it / nchunks, chunk = it % nchunks;
      const int64_t begin = chunk * kChunk;
      const int64_t count = std::min(kChunk, d - begin);
      const float m = mean[static_cast<size_t>(row)], r = rstd[static_cast<size_t>(row)];
      const float* xc = x + row * d + begin;
      const float* wc = w + begin;
      const float* bc = b + begin;
      float* yc = y + row * d + begin;
#pragma omp simd
      for (int64_t i = 0; i < count; ++i) yc[i] = (xc[i] - m) * r * wc[i] + bc[i];
    }
  }
  return 0;
}
