// Prefill GEMM on Hopper's BF16 tensor cores (wgmma): C[M, N] (+)= A[M, K] x B[N, K]^T with A
// and B BF16 (K contiguous) and C FP32. Numerics: the products of BF16 values are exact and the
// sums FP32 (the tensor core's accumulation), so against the CPU's FP32 evaluation of the same
// BF16 operands only the summation order differs; every output's order depends on K alone (one
// accumulator per output, K walked in order), so a row's result does not depend on M or on the
// other rows of its tile.
//
// The executor's operands are FP32 activations and weights in their stored formats: the staging
// kernels below make the BF16 operands (activations rounded RNE, as gemm_tc.cuh stages them;
// weights decoded exactly, kernels/weight_view.h), so `precision = "bf16"` / `"fp8"` (whose
// activations are FP8-QDQ'd first, hence BF16-exact) compute the same values as the tiled
// tensor-core GEMM, summed in another order.
//
// Preconditions (gemm_bf16_wgmma_supported): sm_90a; k % 8 == 0 and lda, ldb % 8 == 0 (TMA rows
// are 16-byte multiples); a, b 16-byte aligned. Parts of a tile past m, n or k read as zeros.
// B may instead be a stored weight decoded inside the kernel (WgmmaGemm::bw): the same C.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/export.h"
#include "kernels/weight_view.h"

namespace dsv41rt::kernels::cuda {

/// Rows of C per CTA tile (the grouped-tile tables below are in units of it).
constexpr int64_t kWgmmaTileM = 128;

struct WgmmaGemm {
  const uint16_t* a = nullptr;  ///< BF16 bits [m, k], row pitch lda
  int64_t lda = 0;
  const uint16_t* b = nullptr;  ///< BF16 bits [n, k], row pitch ldb
  int64_t ldb = 0;
  float* c = nullptr;  ///< FP32 [m, n], row pitch ldc
  int64_t ldc = 0;
  int64_t m = 0, n = 0, k = 0;
  bool accumulate = false;  ///< C += instead of C =
  // Grouped tiles (MoE; capture-safe: the table is read on the device): when `tiles` is set
  // (group [max_tiles], row0 [max_tiles], row_end [max_tiles], as moe_grouped builds it, tiles of
  // kWgmmaTileM rows), grid row t < tile_entries computes C rows [row0, row_end) of A rows from
  // row0 with B rows (group - group_lo) * b_rows_per_group + [0, n); a tile whose group lies
  // outside [group_lo, group_hi) (-1: unused) does nothing. A rows past row_end are read (as one
  // box), never written.
  const int32_t* tiles = nullptr;
  int64_t max_tiles = 0, tile_entries = 0, b_rows_per_group = 0;
  int32_t group_lo = 0, group_hi = 0;
  // B in its stored format instead of `b` (bw.data set; b and ldb unused): the kernel's producer
  // warpgroup decodes each stage's tile of bw into shared memory as weight_to_bf16 decodes it, so C
  // is bitwise that of staging bw's rows with weight_to_bf16 and passing them as b — without the
  // BF16 copy in global memory (issue 19: the staged decode wrote and re-read 4x the MXFP4 bytes).
  // Needs bw.cols == k, weight_vec8_ok(bw), a BF16 / FP8-block / MXFP4 format. B row j (< n) of
  // the tile table's group g (absolute, not relative to group_lo) is bw row bw_row0 +
  // g * b_rows_per_group + j; without tiles, bw row bw_row0 + j.
  WeightView bw;
  int64_t bw_row0 = 0;
};

/// Whether the kernel takes these operands (see the preconditions above).
DSV41RT_API bool gemm_bf16_wgmma_supported(const WgmmaGemm& g);
/// cudaErrorInvalidValue when not supported; cudaErrorNotSupported without the TMA encoder.
DSV41RT_API cudaError_t gemm_bf16_wgmma(const WgmmaGemm& g, cudaStream_t stream);

/// y[r, c] = bf16_rn(x[src, c]) for r < m, c < k (pitches in elements), src = r or, with a
/// gather, gather[r] / gather_div (a negative gather[r] gives a row of zeros).
DSV41RT_API cudaError_t rows_to_bf16(const float* x, int64_t ldx, int64_t m, int64_t k, uint16_t* y,
                                     int64_t ldy, cudaStream_t stream,
                                     const int32_t* gather = nullptr, int64_t gather_div = 1);
/// y[r, c] = bf16(w.value(row0 + r, c)) for r < rows, c < w.cols: the exact decode (every value
/// of a real checkpoint is a normal BF16; FP32 weights are rejected: rounding them would be a
/// silent loss).
DSV41RT_API cudaError_t weight_to_bf16(const WeightView& w, int64_t row0, int64_t rows, uint16_t* y,
                                       int64_t ldy, cudaStream_t stream);

/// C[m, n] = A[m, k] B[n, k]^T for FP32 A and B (row pitches lda, ldb, ldc) with FP32-exact
/// products on the BF16 tensor cores: each operand is split into three BF16 parts, x = x0 + x1 +
/// x2 exactly (8 significant bits each), and every part product x_i y_j (16 bits) is exact in
/// FP32, so C is the sum of the 9 k exact products in another order than an FP32 dot product:
/// summation order is the only difference (subnormal parts aside). Staged as A'' = [a0 a0 a0 a1 a1
/// a1 a2 a2 a2] (9 k per row) and B' = [b0 b1 b2] (3 k per row); C = A''_0 B'^T + A''_1 B'^T +
/// A''_2 B'^T, three wgmma GEMMs with K = 3 k, added in that order. a_ws / b_ws: BF16 workspaces
/// of a_ws_elems >= 9 k * kWgmmaTileM and b_ws_elems >= 3 k * 128 elements; larger ones take more
/// rows per pass. k % 8 == 0.
DSV41RT_API cudaError_t gemm_f32_split3(const float* a, int64_t lda, const float* b, int64_t ldb,
                                        int64_t m, int64_t n, int64_t k, float* c, int64_t ldc,
                                        uint16_t* a_ws, int64_t a_ws_elems, uint16_t* b_ws,
                                        int64_t b_ws_elems, cudaStream_t stream);

}  // namespace dsv41rt::kernels::cuda
