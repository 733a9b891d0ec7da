// Split-K for the skinny decode GEMMs (decode_gemv.cu, decode_gemv_a8.cu): how many splits a
// matrix gets, and the kernel that adds the split partials in split order (deterministic: the
// sum is ((0 + p_0) + p_1) + ..., whatever order the splits finished in).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace dsv41rt::kernels::cuda {

/// Resident CTAs of one wave on an H200 (132 SMs) at 2 CTAs per SM.
constexpr int64_t kSplitKResidentCtas = 2 * 132;

/// Splits for `ctas` CTAs per split over `pieces` K pieces: as many as fit one wave of
/// `resident` CTAs (measured on the H200: more, shorter CTAs pay the pipeline fill again and
/// lose; fewer leave SMs idle), but at least two pieces per split so the partials stay small next
/// to the weights at m = 64. A function of the matrix shape only, never of the token count.
inline int64_t split_k_count(int64_t ctas, int64_t pieces, int64_t resident = kSplitKResidentCtas) {
  if (ctas < 1 || pieces < 1) return 1;
  int64_t s = resident / ctas;
  const int64_t cap = pieces / 2 > 1 ? pieces / 2 : 1;
  s = s < cap ? s : cap;
  return s < 1 ? 1 : (s > 65535 ? 65535 : s);
}

/// Stores a warp's swap-AB accumulators: RT tiles of 16 rows (from row0) by NT tiles of 8 tokens,
/// m16n8 C fragments (c0, c1 = row g, tokens 2t and 2t + 1; c2, c3 = row g + 8, same tokens; lane
/// = 4g + t), rows below n and tokens below m only, at out[tok * ld + row] (+= when add).
template <int RT, int NT>
__device__ __forceinline__ void store_mma_tiles(const float (&acc)[RT][NT][4], float* out,
                                                int64_t ld, bool add, int64_t row0, int64_t n,
                                                int m) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int rt = 0; rt < RT; ++rt) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int64_t r = row0 + rt * 16 + g + (q >= 2 ? 8 : 0);
        const int tok = nt * 8 + 2 * t + (q & 1);
        if (r < n && tok < m) {
          float* o = out + tok * ld + r;
          *o = add ? *o + acc[rt][nt][q] : acc[rt][nt][q];
        }
      }
    }
  }
}

/// The partials: ws[(b * splits + s) * m * n + tok * n + r] for group b < batch.
struct SplitPartials {
  const float* ws;
  int64_t splits, m, n, batch;
  float* y;  ///< y[b * stride_y + tok * ldy + r]
  int64_t ldy, stride_y;
  bool accumulate;  ///< y += sum instead of y = sum
};

/// y (+)= the sum of the split partials, added in split order.
__global__ void __launch_bounds__(kThreads) reduce_split_partials(const SplitPartials p);

/// Launches reduce_split_partials on `stream`.
inline cudaError_t reduce_splits(const SplitPartials& p, cudaStream_t stream) {
  if (p.batch * p.m * p.n > int64_t(0x7fffffff)) return cudaErrorInvalidValue;
  reduce_split_partials<<<blocks_for(p.batch * p.m * p.n), kThreads, 0, stream>>>(p);
  return launch_status();
}

}  // namespace dsv41rt::kernels::cuda
