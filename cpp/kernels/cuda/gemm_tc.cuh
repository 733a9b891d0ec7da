// Tensor-core GEMM with BF16 inputs and FP32 accumulation: C[M, N] (+)= bf16(A)[M, K] x B[N, K]^T.
//
// A is FP32 (the executor's activations) rounded to BF16 (RNE) as it is staged into shared
// memory; B is a weight matrix as stored (kernels/weight_view.h: BF16, FP8 E4M3 blocks, MXFP4),
// decoded exactly to BF16 as it is staged; C is FP32. This is the
// `precision = "bf16"` path of the GPU executor: the products are exact, the sums FP32, and the
// only loss against the FP32 path is the activation rounding (relative ~2^-9 per input element).
// Each output element's reduction order depends only on K (fixed k-tiles, fixed MMA order), not
// on M or on the row's position in a tile, so a row's result does not depend on its batch.
//
// Optional extras, all capture-safe (no host synchronisation, no allocation):
//   - row gather: tile row r reads A row `a_rows[r] / a_row_div` (MoE: grouped positions ->
//     token rows);
//   - batching over grid.z with element strides of A, B and C (grouped projections);
//   - grouped tiles (MoE): a device tile table assigns each M-tile a group (its B matrix, at
//     `group * stride_b_group`) and a row range; tiles with group -1 do nothing.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/export.h"
#include "kernels/weight_view.h"

namespace dsv41rt::kernels::cuda {

/// Rows of one M-tile (the grouped-tile tables are in units of it).
constexpr int64_t kTcTileM = 64;

struct TcGemm {
  const float* a = nullptr;
  int64_t lda = 0;
  const int32_t* a_rows = nullptr;  ///< optional row gather (see above)
  int64_t a_row_div = 1;
  /// The weights (row = output channel; cols == k), whole stacked matrix: batch z, group G,
  /// output column j reads row z * b_rows_per_batch + G * b_rows_per_group + j.
  kernels::WeightView b;
  float* c = nullptr;
  int64_t ldc = 0;
  int64_t m = 0, n = 0, k = 0;
  bool accumulate = false;  ///< C += instead of C =
  int64_t batch = 1, stride_a = 0, b_rows_per_batch = 0, stride_c = 0;
  // Grouped tiles: when tile_group is set, grid.y covers `max_tiles` table entries instead of
  // ceil(m / kTcTileM) contiguous tiles.
  const int32_t* tile_group = nullptr;
  const int32_t* tile_row0 = nullptr;
  const int32_t* tile_row_end = nullptr;
  int64_t max_tiles = 0;
  int64_t b_rows_per_group = 0;
};

DSV41RT_API cudaError_t gemm_bf16_tc(const TcGemm& g, cudaStream_t stream);

}  // namespace dsv41rt::kernels::cuda
