// Skinny-M ("decode") GEMM that reads the weights in their released formats: BF16, block-scaled
// FP8 (E4M3 codes + UE8M0 block scales) and MXFP4 (packed E2M1 + UE8M0 per 32 columns).
//
// Contract (precision "bf16" of the runtime, i.e. W8A16 / W4A16):
//   y[i, j] (+)= sum_c bf16(x[i, c]) * W[row_j, c]          i < m, j < n, c < k
//   bf16()  round-to-nearest-even of the FP32 activation (as gemm_tc.cuh does).
//   W       decoded exactly like WeightView::value(): code * 2^(scale - 127). Every value of a real
//           checkpoint (E4M3 * 2^e, E2M1 * 2^e with |value| >= 2^-126) is exact in BF16. Values
//           below 2^-126 (scales near code 0) are rounded to BF16 subnormals (nearest even) where
//           the FP32 reference keeps more bits; values above BF16's max become +-inf exactly as
//           FP32 overflows. Scale code 255 gives NaN. E4M3 NaN codes (0x7F, 0xFF), which no
//           checkpoint holds, decode to finite numbers (not NaN). MXFP4 code 8 (-0) decodes to -0
//           where the reference has +0: no sum can tell them apart (the FP32 accumulators start at
//           +0, and x * -0 == x * +0 up to the sign of a zero that any other term absorbs).
//   products are exact (BF16 x BF16 in FP32), sums FP32 (tensor cores, mma.sync m16n8k16).
//   The CPU emulation is: round x to BF16, then an FP32 dot with the decoded weights; only the
//   summation order differs.
// Summation order of every output element depends only on k and on the split count S, which is
// a function of (n * batch, k, format) alone (decode_gemv_splits): NOT on m, on the row's position
// or on the token's position in the batch, so a token's result does not depend on the other
// tokens of the batch. With S > 1 the S partial sums (each over a fixed, contiguous k range) are
// added in split order by a second kernel: sum = ((0 + p_0) + p_1) + ...; then y = sum or y + sum.
// Deterministic: no atomics; same inputs give bitwise the same y, eager or graph-replayed.
// Graph-capturable: no allocation, no host synchronisation, static shared memory (< 48 KB).
//
// Batching (grouped projections, e.g. wo_a: x [m, g, k], W [g * n, k], y [m, g, n]): group b reads
// x + b * stride_x, weight rows [b * w_rows_per_batch, + n) and writes y + b * stride_y.
//
// Requirements (decode_gemv_supported; decode_gemv_bf16 returns cudaErrorInvalidValue otherwise,
// never launching anything): 1 <= m <= kDecodeGemvMaxM, n >= 1, 1 <= batch <= 65535,
// w.cols == k; k % 8 == 0 (kBF16) or k % 32 == 0 (kFp8Block, kMxfp4); kFp8Block block_cols a power
// of two >= 16 and block_rows >= 1; x, w.data 16-byte aligned, ldx, stride_x multiples of 4;
// ldx >= k and ldy >= n when m > 1; the weight rows used lie inside w.rows. y must not alias x,
// the weights or the workspace. The workspace (decode_gemv_workspace_floats, 0 when S == 1) holds
// the split partials; it may be nullptr when 0 floats are needed.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/export.h"
#include "kernels/weight_view.h"

namespace dsv41rt::kernels::cuda {

struct DecodeGemv {
  const float* x = nullptr;  ///< activations [m, k] FP32, row stride ldx
  int64_t ldx = 0;
  kernels::WeightView w;  ///< [total_rows, k] weights (kBF16 / kFp8Block / kMxfp4)
  float* y = nullptr;     ///< [m, n] FP32, row stride ldy
  int64_t ldy = 0;
  int64_t m = 0, n = 0, k = 0;
  bool accumulate = false;  ///< y += instead of y =
  // Batching over groups: element strides of x and y per group, weight rows per group.
  int64_t batch = 1, stride_x = 0, stride_y = 0;
  int64_t w_rows_per_batch = 0;  ///< group b uses weight rows [b * w_rows_per_batch, + n)
  /// The shape the split count is chosen for (0: n, batch). A tensor-parallel share of a matrix
  /// passes its whole matrix's (its rows, or its groups), so that each of its columns is summed
  /// in the order the whole matrix's would be: a share's output is bitwise those columns.
  int64_t split_n = 0, split_batch = 0;
};

constexpr int64_t kDecodeGemvMaxM = 64;

/// The split-K count S for g's shape (a function of n * batch, k and the format only; of
/// split_n * split_batch where given).
DSV41RT_API int64_t decode_gemv_splits(const DecodeGemv& g);
/// FP32 floats of split-K partials the launch needs (batch * S * m * n; 0 when S == 1).
DSV41RT_API int64_t decode_gemv_workspace_floats(const DecodeGemv& g);
/// Whether this kernel takes g's shapes, formats and alignments (else: fall back).
DSV41RT_API bool decode_gemv_supported(const DecodeGemv& g);
/// y (+)= bf16(x) * W^T on `stream`. cudaErrorInvalidValue for unsupported inputs or a workspace
/// smaller than decode_gemv_workspace_floats(g).
DSV41RT_API cudaError_t decode_gemv_bf16(const DecodeGemv& g, float* workspace,
                                         int64_t workspace_floats, cudaStream_t stream);

}  // namespace dsv41rt::kernels::cuda
