// rms_norm.cu -- LlamaRMSNorm: out[r, :] = weight * (x[r, :] * rsqrt(mean(x[r, :]^2) + eps)).
//
// One kernel instead of eager PyTorch's chain (to float, pow, mean, add, rsqrt, two
// multiplies, cast back) with its temporaries. Rows of up to 256 16-byte packs (2048 bf16 or
// fp16 values, 1024 fp32 values) get one warp each and a warp-shuffle reduction; longer rows
// get one block each and a block reduction (shuffles, then one float per warp in shared
// memory). The second pass re-reads the row, which is then in L1/L2. When the row length is a
// multiple of a 16-byte pack and the pointers are 16-byte aligned, every load and store moves
// 16 bytes (float4, or 8 halves); otherwise a scalar path runs.
//
// Inputs may be fp32, fp16 or bf16 (x, weight and out of one dtype); the math is fp32, as in
// LlamaRMSNorm: the normalised value is rounded to the input dtype before the weight multiplies
// it, and the product is rounded again, exactly like `weight * hidden_states.to(input_dtype)`.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace {

// How elements are stored and converted: fp32 as float, fp16 and bf16 as their bit patterns.
struct F32 {
  using S = float;
  static __device__ __forceinline__ float load(S v) { return v; }
  static __device__ __forceinline__ S store(float f) { return f; }
};

struct F16 {
  using S = uint16_t;
  static __device__ __forceinline__ float load(S v) { return __half2float(__ushort_as_half(v)); }
  static __device__ __forceinline__ S store(float f) {
    return __half_as_ushort(__float2half_rn(f));
  }
};

struct BF16 {
  using S = uint16_t;
  static __device__ __forceinline__ float load(S v) {
    return __uint_as_float(static_cast<uint32_t>(v) << 16);
  }
  static __device__ __forceinline__ S store(float f) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(f));
  }
};

// 16 bytes of elements, moved by one vector load or store.
template <class S>
struct alignas(16) Pack {
  static constexpr int N = 16 / sizeof(S);
  S v[N];
};

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// The sum of v over the block (blockDim.x a multiple of 32); every thread gets it.
__device__ __forceinline__ float block_sum(float v, float* partial /* [32] */) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  v = warp_sum(v);
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < static_cast<int>(blockDim.x >> 5) ? partial[lane] : 0.0f;
  __syncthreads();  // partial may be written again for the next row
  return warp_sum(v);
}

// This thread's share of the row's sum of squares: elements (or packs) lane, lane + lanes, ...
template <class D, bool VEC>
__device__ __forceinline__ float sum_squares(const typename D::S* __restrict__ x, int64_t cols,
                                             int lane, int lanes) {
  using S = typename D::S;
  float sum = 0.0f;
  if constexpr (VEC) {
    const Pack<S>* xp = reinterpret_cast<const Pack<S>*>(x);
    for (int64_t i = lane; i < cols / Pack<S>::N; i += lanes) {
      const Pack<S> p = xp[i];
#pragma unroll
      for (int k = 0; k < Pack<S>::N; ++k) {
        const float f = D::load(p.v[k]);
        sum += f * f;
      }
    }
  } else {
    for (int64_t i = lane; i < cols; i += lanes) {
      const float f = D::load(x[i]);
      sum += f * f;
    }
  }
  return sum;
}

template <class D>
__device__ __forceinline__ typename D::S normalise(typename D::S x, typename D::S w,
                                                   float inv_rms) {
  return D::store(D::load(w) * D::load(D::store(D::load(x) * inv_rms)));
}

// This thread's share of the row's output.
template <class D, bool VEC>
__device__ __forceinline__ void scale_row(const typename D::S* __restrict__ x,
                                          const typename D::S* __restrict__ weight,
                                          typename D::S* __restrict__ out, int64_t cols,
                                          float inv_rms, int lane, int lanes) {
  using S = typename D::S;
  if constexpr (VEC) {
    const Pack<S>* xp = reinterpret_cast<const Pack<S>*>(x);
    const Pack<S>* wp = reinterpret_cast<const Pack<S>*>(weight);
    Pack<S>* op = reinterpret_cast<Pack<S>*>(out);
    for (int64_t i = lane; i < cols / Pack<S>::N; i += lanes) {
      const Pack<S> p = xp[i];
      const Pack<S> w = wp[i];
      Pack<S> r;
#pragma unroll
      for (int k = 0; k < Pack<S>::N; ++k) r.v[k] = normalise<D>(p.v[k], w.v[k], inv_rms);
      op[i] = r;
    }
  } else {
    for (int64_t i = lane; i < cols; i += lanes) {
      out[i] = normalise<D>(x[i], weight[i], inv_rms);
    }
  }
}

// One warp per row; blockDim.x / 32 rows per block at a time, grid-stride over rows.
template <class D, bool VEC>
__global__ void rms_norm_warp_rows(const typename D::S* __restrict__ x,
                                   const typename D::S* __restrict__ weight,
                                   typename D::S* __restrict__ out, int64_t rows, int64_t cols,
                                   float eps) {
  const int lane = threadIdx.x & 31;
  const int64_t warps_per_block = blockDim.x >> 5;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * warps_per_block;
  for (int64_t r = blockIdx.x * warps_per_block + (threadIdx.x >> 5); r < rows; r += stride) {
    const float sum = warp_sum(sum_squares<D, VEC>(x + r * cols, cols, lane, 32));
    const float inv_rms = rsqrtf(sum / static_cast<float>(cols) + eps);
    scale_row<D, VEC>(x + r * cols, weight, out + r * cols, cols, inv_rms, lane, 32);
  }
}

// One block per row, grid-stride over rows.
template <class D, bool VEC>
__global__ void rms_norm_block_rows(const typename D::S* __restrict__ x,
                                    const typename D::S* __restrict__ weight,
                                    typename D::S* __restrict__ out, int64_t rows, int64_t cols,
                                    float eps) {
  __shared__ float partial[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float sum = block_sum(
        sum_squares<D, VEC>(x + r * cols, cols, threadIdx.x, blockDim.x), partial);
    const float inv_rms = rsqrtf(sum / static_cast<float>(cols) + eps);
    scale_row<D, VEC>(x + r * cols, weight, out + r * cols, cols, inv_rms, threadIdx.x,
                      blockDim.x);
  }
}

int multiprocessors() {
  int device = 0;
  int sms = 1;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  return sms;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

template <class D, bool VEC>
void launch(const void* x, const void* weight, void* out, int64_t rows, int64_t cols, float eps,
            int config, cudaStream_t stream) {
  using S = typename D::S;
  const S* xs = static_cast<const S*>(x);
  const S* ws = static_cast<const S*>(weight);
  S* os = static_cast<S*>(out);
  const int64_t units = VEC ? cols / Pack<S>::N : cols;  // loads per row
  const int64_t cap = static_cast<int64_t>(multiprocessors()) * 16;
  if (units <= 256) {
    const int threads = 128;  // 4 rows per block at a time
    const int64_t blocks = min64((rows + 3) / 4, cap);
    rms_norm_warp_rows<D, VEC><<<static_cast<int>(blocks), threads, 0, stream>>>(
        xs, ws, os, rows, cols, eps);
    return;
  }
  int threads = config;
  if (!(threads >= 32 && threads <= 1024 && threads % 32 == 0)) {
    // about four loads per thread per pass, 128 to 1024 threads
    const int64_t wanted = ((units + 3) / 4 + 31) / 32 * 32;
    threads = static_cast<int>(wanted < 128 ? 128 : (wanted > 1024 ? 1024 : wanted));
  }
  rms_norm_block_rows<D, VEC><<<static_cast<int>(min64(rows, cap)), threads, 0, stream>>>(
      xs, ws, os, rows, cols, eps);
}

template <class D>
void dispatch(const void* x, const void* weight, void* out, int64_t rows, int64_t cols,
              float eps, int config, cudaStream_t stream) {
  constexpr int N = Pack<typename D::S>::N;
  if (cols % N == 0 && aligned16(x) && aligned16(weight) && aligned16(out)) {
    launch<D, true>(x, weight, out, rows, cols, eps, config, stream);
  } else {
    launch<D, false>(x, weight, out, rows, cols, eps, config, stream);
  }
}

}  // namespace

// x, out: rows * cols contiguous elements; weight: cols elements; all of one dtype:
// 0 float32, 1 float16, 2 bfloat16. config: threads per block of the one-block-per-row kernel
// (a multiple of 32, at most 1024); 0 picks from the row length.
// Returns 0, or -1 for an unknown dtype.
extern "C" int rms_norm_launch(const void* x, const void* weight, void* out, int64_t rows,
                               int64_t cols, float eps, int dtype, int config,
                               cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return 0;
  switch (dtype) {
    case 0: dispatch<F32>(x, weight, out, rows, cols, eps, config, stream); return 0;
    case 1: dispatch<F16>(x, weight, out, rows, cols, eps, config, stream); return 0;
    case 2: dispatch<BF16>(x, weight, out, rows, cols, eps, config, stream); return 0;
    default: return -1;
  }
}
