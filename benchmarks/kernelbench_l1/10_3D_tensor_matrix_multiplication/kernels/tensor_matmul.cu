// tensor_matmul.cu -- C (M x N) = A (M x K) @ B (K x N), all row-major fp32.
//
// torch.matmul of an (..., K) tensor with a (K, N) matrix is this GEMM with M = the product
// of A's leading sizes. True fp32 on the CUDA cores: no TF32, no reduced precision, one
// fused multiply-add chain per output element in ascending k.
//
// Register-tiled SGEMM. A block computes a BM x BN tile of C with (BM/8)*(BN/8) threads,
// each owning an 8x8 sub-tile made of four 4x4 quadrants (rows ty*4 and BM/2 + ty*4, columns
// tx*4 and BN/2 + tx*4), so that its shared-memory reads are float4 and a warp's reads of B
// are contiguous. K is walked in slices of BK (8 or 16):
//   * the A slice (BM x BK) is loaded with float4 along k and stored transposed, As[k][m],
//     with 4 floats of padding per row so that the transposing stores collide less in banks;
//   * the B slice (BK x BN) is loaded with float4 along n and stored as is;
//   * two shared-memory buffers: while the block computes on slice t, each thread already
//     holds slice t+1 in registers and stores it to the other buffer afterwards, so there is
//     one __syncthreads per slice and global latency is hidden behind 64 FMAs per k.
// Edges are handled by zero-filled loads and guarded stores, so any M, N, K works (K = 0
// gives zeros). The float4 global paths need K % 4 == 0 (A) or N % 4 == 0 (B, C) and 16-byte
// aligned pointers; otherwise the same kernel loads scalars.
//
// Two tile shapes: 128x128 (256 threads) for large problems; 64x64 (64 threads) when the
// 128x128 grid would not fill the GPU. Large tiles use BK = 16 when B is loaded as float4
// (half the barriers; about 4% faster than BK = 8 on an H200), else BK = 8, which keeps the
// scalar-load variants within 128 registers. The grid is 1-D with the N-tile index fastest,
// so consecutive blocks share a row panel of A: A, the large operand, is read from DRAM
// about once, and B (small here) stays in L2.
#include <cuda_runtime.h>

#include <cstdint>

namespace {

constexpr int kPadA = 4;

template <int BM, int BN, int kBK, bool VEC_A, bool VEC_B>
struct Gemm {
  static constexpr int kThreads = (BM / 8) * (BN / 8);
  static constexpr int kLoadsA = BM * kBK / 4 / kThreads;  // float4 slots of A per thread
  static constexpr int kLoadsB = BN * kBK / 4 / kThreads;  // float4 slots of B per thread
  static_assert(kLoadsA * kThreads * 4 == BM * kBK, "A slice must split evenly");
  static_assert(kLoadsB * kThreads * 4 == BN * kBK, "B slice must split evenly");

  struct Smem {
    float a[2][kBK][BM + kPadA];
    float b[2][kBK][BN];
  };

  // Global -> registers: the A and B slices that start at k0.
  static __device__ __forceinline__ void load(const float* __restrict__ A,
                                              const float* __restrict__ B, int M, int N, int K,
                                              int m0, int n0, int k0, float4 (&ra)[kLoadsA],
                                              float4 (&rb)[kLoadsB]) {
#pragma unroll
    for (int i = 0; i < kLoadsA; ++i) {
      const int slot = static_cast<int>(threadIdx.x) + i * kThreads;
      const int m = m0 + slot / (kBK / 4);
      const int k = k0 + (slot % (kBK / 4)) * 4;
      const float* p = A + static_cast<int64_t>(m) * K + k;
      if constexpr (VEC_A) {
        ra[i] = (m < M && k < K) ? __ldg(reinterpret_cast<const float4*>(p))
                                 : make_float4(0.f, 0.f, 0.f, 0.f);
      } else {
        const bool row_ok = m < M;
        ra[i].x = row_ok && k + 0 < K ? __ldg(p + 0) : 0.f;
        ra[i].y = row_ok && k + 1 < K ? __ldg(p + 1) : 0.f;
        ra[i].z = row_ok && k + 2 < K ? __ldg(p + 2) : 0.f;
        ra[i].w = row_ok && k + 3 < K ? __ldg(p + 3) : 0.f;
      }
    }
#pragma unroll
    for (int i = 0; i < kLoadsB; ++i) {
      const int slot = static_cast<int>(threadIdx.x) + i * kThreads;
      const int k = k0 + slot / (BN / 4);
      const int n = n0 + (slot % (BN / 4)) * 4;
      const float* p = B + static_cast<int64_t>(k) * N + n;
      if constexpr (VEC_B) {
        rb[i] = (k < K && n < N) ? __ldg(reinterpret_cast<const float4*>(p))
                                 : make_float4(0.f, 0.f, 0.f, 0.f);
      } else {
        const bool row_ok = k < K;
        rb[i].x = row_ok && n + 0 < N ? __ldg(p + 0) : 0.f;
        rb[i].y = row_ok && n + 1 < N ? __ldg(p + 1) : 0.f;
        rb[i].z = row_ok && n + 2 < N ? __ldg(p + 2) : 0.f;
        rb[i].w = row_ok && n + 3 < N ? __ldg(p + 3) : 0.f;
      }
    }
  }

  // Registers -> shared buffer `buf` (A transposed to k-major).
  static __device__ __forceinline__ void store(Smem& s, int buf, const float4 (&ra)[kLoadsA],
                                               const float4 (&rb)[kLoadsB]) {
#pragma unroll
    for (int i = 0; i < kLoadsA; ++i) {
      const int slot = static_cast<int>(threadIdx.x) + i * kThreads;
      const int m = slot / (kBK / 4);
      const int k = (slot % (kBK / 4)) * 4;
      s.a[buf][k + 0][m] = ra[i].x;
      s.a[buf][k + 1][m] = ra[i].y;
      s.a[buf][k + 2][m] = ra[i].z;
      s.a[buf][k + 3][m] = ra[i].w;
    }
#pragma unroll
    for (int i = 0; i < kLoadsB; ++i) {
      const int slot = static_cast<int>(threadIdx.x) + i * kThreads;
      const int k = slot / (BN / 4);
      const int n = (slot % (BN / 4)) * 4;
      *reinterpret_cast<float4*>(&s.b[buf][k][n]) = rb[i];
    }
  }

  static __device__ __forceinline__ void run(const float* __restrict__ A,
                                             const float* __restrict__ B, float* __restrict__ C,
                                             int M, int N, int K) {
    __shared__ __align__(16) Smem s;
    const int tx = static_cast<int>(threadIdx.x) % (BN / 8);
    const int ty = static_cast<int>(threadIdx.x) / (BN / 8);
    // 1-D grid, N-tiles fastest: consecutive blocks share a row panel of A.
    const int n_tiles = (N + BN - 1) / BN;
    const int m0 = static_cast<int>(blockIdx.x / n_tiles) * BM;
    const int n0 = static_cast<int>(blockIdx.x % n_tiles) * BN;

    float acc[8][8];
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[i][j] = 0.f;

    float4 ra[kLoadsA];
    float4 rb[kLoadsB];
    const int slices = (K + kBK - 1) / kBK;
    if (slices > 0) {
      load(A, B, M, N, K, m0, n0, 0, ra, rb);
      store(s, 0, ra, rb);
    }
    __syncthreads();

    for (int t = 0; t < slices; ++t) {
      const int cur = t & 1;
      const bool more = t + 1 < slices;
      if (more) load(A, B, M, N, K, m0, n0, (t + 1) * kBK, ra, rb);
#pragma unroll
      for (int k = 0; k < kBK; ++k) {
        const float4 a_lo = *reinterpret_cast<const float4*>(&s.a[cur][k][ty * 4]);
        const float4 a_hi = *reinterpret_cast<const float4*>(&s.a[cur][k][BM / 2 + ty * 4]);
        const float4 b_lo = *reinterpret_cast<const float4*>(&s.b[cur][k][tx * 4]);
        const float4 b_hi = *reinterpret_cast<const float4*>(&s.b[cur][k][BN / 2 + tx * 4]);
        const float av[8] = {a_lo.x, a_lo.y, a_lo.z, a_lo.w, a_hi.x, a_hi.y, a_hi.z, a_hi.w};
        const float bv[8] = {b_lo.x, b_lo.y, b_lo.z, b_lo.w, b_hi.x, b_hi.y, b_hi.z, b_hi.w};
#pragma unroll
        for (int i = 0; i < 8; ++i)
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
      }
      if (more) store(s, cur ^ 1, ra, rb);
      __syncthreads();
    }

    // Epilogue: quadrant rows (ty*4 + i, BM/2 + ty*4 + i), columns (tx*4, BN/2 + tx*4).
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int m = m0 + (i < 4 ? ty * 4 + i : BM / 2 + ty * 4 + (i - 4));
      if (m >= M) continue;
      float* crow = C + static_cast<int64_t>(m) * N;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int n = n0 + (half == 0 ? tx * 4 : BN / 2 + tx * 4);
        const float* v = &acc[i][half * 4];
        if constexpr (VEC_B) {
          if (n < N) *reinterpret_cast<float4*>(crow + n) = make_float4(v[0], v[1], v[2], v[3]);
        } else {
#pragma unroll
          for (int j = 0; j < 4; ++j)
            if (n + j < N) crow[n + j] = v[j];
        }
      }
    }
  }
};

template <int BM, int BN, int BK, bool VEC_A, bool VEC_B>
__global__ void __launch_bounds__((BM / 8) * (BN / 8), BM == 128 ? 2 : 4)
sgemm(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C, int M,
      int N, int K) {
  Gemm<BM, BN, BK, VEC_A, VEC_B>::run(A, B, C, M, N, K);
}

template <int BM, int BN, int BK, bool VEC_A, bool VEC_B>
void launch_one(const float* A, const float* B, float* C, int M, int N, int K,
                cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(((N + BN - 1) / BN) * ((M + BM - 1) / BM)));
  const dim3 block((BM / 8) * (BN / 8));
  sgemm<BM, BN, BK, VEC_A, VEC_B><<<grid, block, 0, stream>>>(A, B, C, M, N, K);
}

template <int BM, int BN, int BK>
void launch_tile(bool vec_a, bool vec_b, const float* A, const float* B, float* C, int M, int N,
                 int K, cudaStream_t stream) {
  if (vec_a && vec_b) {
    launch_one<BM, BN, BK, true, true>(A, B, C, M, N, K, stream);
  } else if (vec_a) {
    launch_one<BM, BN, BK, true, false>(A, B, C, M, N, K, stream);
  } else if (vec_b) {
    launch_one<BM, BN, BK, false, true>(A, B, C, M, N, K, stream);
  } else {
    launch_one<BM, BN, BK, false, false>(A, B, C, M, N, K, stream);
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

// config: 0 = automatic, 1 = 128x128 tiles, 2 = 64x64 tiles, 3 = automatic with scalar loads,
// 4 = 128x128 tiles with 8-deep k slices.
extern "C" int tensor_matmul_launch(const float* A, const float* B, float* C, int64_t M,
                                    int64_t N, int64_t K, int config, cudaStream_t stream) {
  if (M <= 0 || N <= 0) return 0;
  if (M > 0x7fffffff || N > 0x7fffffff || K > 0x7fffffff || K < 0 ||
      ((M + 63) / 64) * ((N + 63) / 64) > 0x7fffffff)  // 1-D grid limit
    return static_cast<int>(cudaErrorInvalidValue);
  const bool vec_a = config != 3 && K % 4 == 0 && aligned16(A);
  const bool vec_b = config != 3 && N % 4 == 0 && aligned16(B) && aligned16(C);
  bool big = config == 1 || config == 4;
  if (config == 0 || config == 3) {
    int device = 0, sms = 132;
    if (cudaGetDevice(&device) == cudaSuccess)
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    const int64_t tiles = ((M + 127) / 128) * ((N + 127) / 128);
    big = tiles >= 2 * static_cast<int64_t>(sms);
  }
  const int m = static_cast<int>(M), n = static_cast<int>(N), k = static_cast<int>(K);
  if (big && vec_b && config != 4) {
    // 16-deep k slices: half the barriers per FMA; register-light only with float4 B loads.
    if (vec_a) {
      launch_one<128, 128, 16, true, true>(A, B, C, m, n, k, stream);
    } else {
      launch_one<128, 128, 16, false, true>(A, B, C, m, n, k, stream);
    }
  } else if (big) {
    launch_tile<128, 128, 8>(vec_a, vec_b, A, B, C, m, n, k, stream);
  } else {
    launch_tile<64, 64, 8>(vec_a, vec_b, A, B, C, m, n, k, stream);
  }
  return static_cast<int>(cudaGetLastError());
}
