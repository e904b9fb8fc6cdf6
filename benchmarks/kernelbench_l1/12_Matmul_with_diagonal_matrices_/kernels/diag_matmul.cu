// diag_matmul.cu -- C = diag(a) @ B, i.e. C[r, c] = a[r] * B[r, c], for row-major B (rows x cols).
//
// A pure streaming kernel: every element of B is read once and every element of C written
// once, so the goal is full memory bandwidth. Each block covers a tile of
// (blockDim.y rows) x (blockDim.x * kUnroll vectors); a thread loads kUnroll vectors of its
// row before it stores any, so several independent 16-byte loads are in flight per thread.
// B and C are touched exactly once, so loads and stores use the streaming cache hints.
// The row scale a[r] is read once per thread and row.
//
// At the benchmark's 4096 x 4096 it runs within about 7% of a device-to-device copy of B
// (H200: 0.037 ms against 0.035 ms for the copy, 0.053 ms for PyTorch's broadcast multiply).
//
// The float4 path needs cols % 4 == 0 and 16-byte aligned B and C; otherwise the same
// kernel runs on scalars. Narrow matrices get narrow blocks (blockDim.x down to 1) and more
// rows per block, which keeps warps dense because rows are contiguous in memory.
#include <cuda_runtime.h>

#include <cstdint>

namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;
constexpr int kMaxGridY = 65535;

__device__ __forceinline__ float4 load_stream(const float4* p) { return __ldcs(p); }
__device__ __forceinline__ float load_stream(const float* p) { return __ldcs(p); }
__device__ __forceinline__ void store_stream(float4* p, float4 v) { __stcs(p, v); }
__device__ __forceinline__ void store_stream(float* p, float v) { __stcs(p, v); }

__device__ __forceinline__ float4 scale(float4 v, float s) {
  return make_float4(v.x * s, v.y * s, v.z * s, v.w * s);
}
__device__ __forceinline__ float scale(float v, float s) { return v * s; }

// V is float4 or float; cols_v counts V elements per row.
template <class V>
__global__ void __launch_bounds__(kThreads)
diag_scale_rows(const float* __restrict__ a, const V* __restrict__ b, V* __restrict__ c,
                int64_t rows, int64_t cols_v) {
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * blockDim.x * kUnroll + threadIdx.x;
  const int64_t row_step = static_cast<int64_t>(gridDim.y) * blockDim.y;
  for (int64_t r = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y; r < rows;
       r += row_step) {
    const float s = __ldg(a + r);
    const V* brow = b + r * cols_v;
    V* crow = c + r * cols_v;
    V v[kUnroll];
#pragma unroll
    for (int i = 0; i < kUnroll; ++i) {
      const int64_t col = col0 + static_cast<int64_t>(i) * blockDim.x;
      if (col < cols_v) v[i] = load_stream(brow + col);
    }
#pragma unroll
    for (int i = 0; i < kUnroll; ++i) {
      const int64_t col = col0 + static_cast<int64_t>(i) * blockDim.x;
      if (col < cols_v) store_stream(crow + col, scale(v[i], s));
    }
  }
}

template <class V>
void launch(const float* a, const V* b, V* c, int64_t rows, int64_t cols_v, int64_t max_grid_y,
            cudaStream_t stream) {
  // Threads along a row: enough to cover it in kUnroll passes, a power of two, at most 256.
  const int64_t per_row = (cols_v + kUnroll - 1) / kUnroll;
  int tx = 1;
  while (tx < kThreads && tx < per_row) tx *= 2;
  const int ty = kThreads / tx;
  const int64_t grid_x = (cols_v + static_cast<int64_t>(tx) * kUnroll - 1) /
                         (static_cast<int64_t>(tx) * kUnroll);
  int64_t grid_y = (rows + ty - 1) / ty;
  if (grid_y > max_grid_y) grid_y = max_grid_y;
  diag_scale_rows<V><<<dim3(static_cast<unsigned>(grid_x), static_cast<unsigned>(grid_y)),
                       dim3(tx, ty), 0, stream>>>(a, b, c, rows, cols_v);
}

}  // namespace

// config: 0 = choose automatically, 1 = force the scalar path (for testing), N >= 2 = at most
// N blocks along the rows (each block then loops over several row groups).
extern "C" int diag_matmul_launch(const float* a, const float* b, float* c, int64_t rows,
                                  int64_t cols, int config, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return 0;
  const bool aligned = (reinterpret_cast<uintptr_t>(b) % 16 == 0) &&
                       (reinterpret_cast<uintptr_t>(c) % 16 == 0) && (cols % 4 == 0);
  const int64_t max_grid_y = config >= 2 && config < kMaxGridY ? config : kMaxGridY;
  if (aligned && config != 1) {
    launch<float4>(a, reinterpret_cast<const float4*>(b), reinterpret_cast<float4*>(c), rows,
                   cols / 4, max_grid_y, stream);
  } else {
    launch<float>(a, b, c, rows, cols, max_grid_y, stream);
  }
  return static_cast<int>(cudaGetLastError());
}
