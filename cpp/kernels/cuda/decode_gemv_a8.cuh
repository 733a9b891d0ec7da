// Decode GEMM in the official inference numerics (spec §5.2, "A8"): FP8 E4M3 activations in 1x32
// blocks with power-of-two (UE8M0) scales times FP8 E4M3 weights with UE8M0 block scales, the
// FP8 x FP8 products summed per 32-wide K block on tensor cores and promoted to FP32 there.
//
// Two steps:
//   quantize_act_fp8: x [m, k] FP32 -> packed rows [m] of (k E4M3 codes, k / 32 UE8M0 codes) with
//     row stride ldq bytes. Each value is first rounded to BF16 (the reference's activations are
//     BF16; kernels::cpu::fp8_act_qdq), then codes and scales are BITWISE
//     kernels::cpu::fp8_window_pack (kernels/quant.h: s = pow2ceil(max(amax, 1e-4) * f32(1/448)),
//     code = e4m3_rne(clamp(x / s, -448, 448))): the NeMo fp8 cache codec, which is spec §5.2's
//     activation format (E4M3, 1x32, UE8M0). That the release's activation quantiser floors amax at
//     1e-4 like it is not verified here; it only matters for blocks whose |x| are all below 1e-4.
//   decode_gemv_a8: y[i, j] (+)= sum over 32-column blocks b, in ascending b, of
//       P_b(i, j) * (sx[i, b] * sw[j, b]),    P_b = sum_{c in b} qx[i, c] * qw[j, c]
//     qx / qw the E4M3 values (no scale), sx / sw the UE8M0 scales (2^(e - 127); code 255 = NaN).
//     Every product qx * qw is exact; P_b is the tensor core's FP8 sum of 32 products
//     (wgmma m64nNk32 or mma.sync m16n8k32, FP32 result; its internal accumulation keeps fewer
//     bits than FP32 — the hardware's, and the official kernels', numerics), then
//     acc = fma(P_b, s, acc) in FP32 with s a power of two (exact unless it leaves FP32's range).
//   The CPU evaluation of exactly this: the P_b summed exactly, scaled, added in FP64; the
//   differences are the tensor core's P_b rounding and the FP32 order of the promoted sum.
// Summation order depends only on k and the split count S (a function of n, k alone), not on m
// or on a token's position: a token's result does not depend on the other tokens of the batch.
// Deterministic (no atomics), graph-capturable (no allocation, no host synchronisation).
//
// Requirements (decode_gemv_a8_supported; cudaErrorInvalidValue otherwise, nothing launched):
// 1 <= m <= kDecodeGemvA8MaxM, n >= 1, k % 128 == 0, w FP8 blocks with w.cols == k, n <= w.rows,
// block_cols % 32 == 0, block_rows % 16 == 0, k <= 16384 on the wgmma path; xq, w.data 16-byte
// aligned, ldq % 16 == 0 and ldq >= k + k / 32; ldy >= n when m > 1. y must not alias xq, the
// weights or the workspace; the workspace (decode_gemv_a8_workspace_floats, 0 when S == 1) holds
// the split partials.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/export.h"
#include "kernels/weight_view.h"

namespace dsv41rt::kernels::cuda {

constexpr int64_t kDecodeGemvA8MaxM = 64;

/// Which tensor-core instruction computes the block sums. kWgmma (Hopper's FP8 datapath, sm_90a)
/// is the default; kMmaSync (sm_90 emulates it through FP16 MMAs, slower) stays for comparison.
/// Same arithmetic contract; the split count, hence the last bits, may differ between them.
enum class A8Path : uint8_t { kWgmma, kMmaSync };

/// Bytes of one packed activation row for k columns (k codes + k / 32 scale codes).
constexpr int64_t act_fp8_row_bytes(int64_t k) { return k + k / 32; }

/// x [m, k] (row stride ldx floats) -> packed rows of ldq bytes. k % 32 == 0, ldq >= k + k / 32.
DSV41RT_API cudaError_t quantize_act_fp8(const float* x, int64_t m, int64_t k, int64_t ldx,
                                         uint8_t* q, int64_t ldq, cudaStream_t stream);

struct DecodeGemvA8 {
  const uint8_t* xq = nullptr;  ///< [m] packed activation rows (quantize_act_fp8), stride ldq
  int64_t ldq = 0;
  kernels::WeightView w;  ///< [rows >= n, k] FP8 E4M3 with UE8M0 block scales
  float* y = nullptr;     ///< [m, n] FP32, row stride ldy
  int64_t ldy = 0;
  int64_t m = 0, n = 0, k = 0;
  bool accumulate = false;  ///< y += instead of y =
  A8Path path = A8Path::kWgmma;
  /// The rows the split count is chosen for (0: n); a tensor-parallel share passes its whole
  /// matrix's, so its columns are bitwise the whole matrix's (as DecodeGemv::split_n).
  int64_t split_n = 0;
};

DSV41RT_API bool decode_gemv_a8_supported(const DecodeGemvA8& g);
/// The split-K count S (a function of n, or split_n where given, k and the path only).
DSV41RT_API int64_t decode_gemv_a8_splits(const DecodeGemvA8& g);
/// FP32 floats of split partials the launch needs (S * m * n; 0 when S == 1).
DSV41RT_API int64_t decode_gemv_a8_workspace_floats(const DecodeGemvA8& g);
DSV41RT_API cudaError_t decode_gemv_a8(const DecodeGemvA8& g, float* workspace,
                                       int64_t workspace_floats, cudaStream_t stream);

}  // namespace dsv41rt::kernels::cuda
