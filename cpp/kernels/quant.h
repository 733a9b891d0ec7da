// Contract: V4.1 cache quantisers (spec section 5.3) and release weight dequantisation (5.1), FP32.
//
// Cache QDQ ("quantise then dequantise", what the reference applies to every cache value):
//   x [rows, dim] row-major FP32 -> y [rows, dim] FP32; each row is split into consecutive channel
//   blocks; dim must be a positive multiple of the block (throws Error otherwise). y may alias x.
//   The numerics reproduce NeMo Automodel `quantize_cache` (deepseek_v41/quantization.py, run on
//   CPU with torch 2.13) bit for bit, including the order of FP32 operations:
//     amax   = max |x| over the block (NaN if any element is NaN)
//     fp8    (block 32): s = pow2ceil(max(amax, 1e-4f) * f32(1/448));
//                        y = f32(e4m3_rne(clamp(x / s, -448, 448))) * s
//     nvfp4  (block 16): s = f32(e4m3_rne_saturating(max(amax, 6*2^-9) / 6));
//                        y = e2m1(clamp(x / s, -6, 6)) * s
//     mxfp4  (block 32): s = pow2ceil(max(amax, 6*2^-126) * f32(1/6));  y as nvfp4
//   pow2ceil is NeMo's exponent/mantissa bit operation (exact; a subnormal rounds to 2^-126);
//   x / s is a true IEEE division (not x * (1/s)); the product max(..) * f32(1/448) is NOT the
//   same as max(..) / 448. e2m1 rounds the magnitude to {0, .5, 1, 1.5, 2, 3, 4, 6} with ties to
//   the even code and keeps the sign of its input, so negative values that round to zero give -0.
//     v4_row (block 64 over channels 0..447): the fp8 rule above; channels 448..511:
//                        y = f32(bf16_rne(x)) (NaN stays NaN, inf stays inf)
//   Non-finite inputs also follow NeMo's arithmetic: a NaN in an fp8/mxfp4 block makes pow2ceil
//   return -0 (so the block's finite values become +-0 and its zeros NaN), an inf makes s = inf.
//
// Packed cache rows (the runtime stores bytes and dequantises on read), one row per `dim` vector:
//   fp8_window: [dim E4M3 codes][dim/32 UE8M0 scale codes]                 528 B for dim 512
//   nvfp4:      [dim/2 E2M1 bytes][dim/16 E4M3 scale codes]                288 B for dim 512
//   mxfp4:      [dim/2 E2M1 bytes][dim/32 UE8M0 scale codes]               68 B for dim 128
//   v4_row:     [448 E4M3][7 UE8M0 scales + 1 zero pad byte][64 BF16, little-endian]  584 B
//               (DeepSeek-V4, spec 5.4; dim must be 512: channels 0..447 are the nope part, FP8
//               as fp8_window but in blocks of 64; 448..511 the rope part, rounded to BF16 RNE)
//   E2M1 bytes hold the even channel in the low nibble and the odd channel in the high nibble;
//   scales follow the data in channel order. A negative zero is stored as code 8.
//   Invariant: unpack(pack(x)) == qdq(x) bitwise for all finite x (and for nvfp4 also with inf/NaN,
//   up to NaN payloads). fp8_window/mxfp4 blocks containing inf or NaN are stored with scale code
//   0xFF (NaN), so the whole block unpacks to NaN (NeMo's QDQ gives the odd values above instead).
//
// Weight dequantisation (release formats):
//   dequant_fp8_blocks: codes [rows, cols] E4M3, scales [ceil(rows/br), ceil(cols/bc)] UE8M0
//                       (partial edge blocks allowed); out[r, c] = e4m3(codes) * 2^(e - 127).
//   dequant_fp4_rows:   packed [rows, cols/2] E2M1 bytes (even column in the low nibble), scales
//                       [rows, ceil(cols/32)] UE8M0; cols must be even. Code 8 (-0) decodes to
//                       +0, as NeMo's decode table does (spec 5.1 lists -0; only the zero sign
//                       differs).
//   dequant_bf16:       n BF16 codes -> FP32 (exact).
//   UE8M0 code 0 is 2^-127 and 255 is NaN (torch float8_e8m0fnu).
#pragma once

#include <cstdint>

#include "core/export.h"

namespace dsv41rt::kernels {

inline constexpr int64_t kFp8WindowBlock = 32;
inline constexpr int64_t kNvfp4Block = 16;
inline constexpr int64_t kMxfp4Block = 32;
/// DeepSeek-V4's row (spec 5.4): one width only, the release's head_dim 512 with a 64-channel
/// rope part. Where a config is at hand, callers check head_dim - qk_rope_head_dim == kV4RowNope.
inline constexpr int64_t kV4RowDim = 512;
inline constexpr int64_t kV4RowNope = 448;
inline constexpr int64_t kV4RowBlock = 64;
inline constexpr int64_t kV4RowScaleBytes = 8;  // 7 UE8M0 scales, padded to 8 bytes
inline constexpr int64_t kV4RowBytes =
    kV4RowNope + kV4RowScaleBytes + 2 * (kV4RowDim - kV4RowNope);  // 584

/// Bytes of one packed row (dim must be a multiple of the block; not checked here).
constexpr int64_t fp8_window_row_bytes(int64_t dim) { return dim + dim / kFp8WindowBlock; }
constexpr int64_t nvfp4_row_bytes(int64_t dim) { return dim / 2 + dim / kNvfp4Block; }
constexpr int64_t mxfp4_row_bytes(int64_t dim) { return dim / 2 + dim / kMxfp4Block; }

}  // namespace dsv41rt::kernels

namespace dsv41rt::kernels::cpu {

/// Cache QDQ, x [rows, dim] -> y [rows, dim] (y may equal x).
DSV41RT_API void fp8_window_qdq(const float* x, int64_t rows, int64_t dim, float* y);
DSV41RT_API void nvfp4_qdq(const float* x, int64_t rows, int64_t dim, float* y);
DSV41RT_API void mxfp4_qdq(const float* x, int64_t rows, int64_t dim, float* y);
/// DeepSeek-V4 rows (dim must be kV4RowDim, else an Error naming it).
DSV41RT_API void v4_row_qdq(const float* x, int64_t rows, int64_t dim, float* y);

/// GEMM activation QDQ of spec section 5.2 (precision "fp8"): each value rounded to BF16 (nearest
/// even: the reference holds activations in BF16), then fp8_window_qdq (E4M3, 1 x 32 blocks,
/// power-of-two scales). dim must be a positive multiple of 32; y may equal x.
DSV41RT_API void fp8_act_qdq(const float* x, int64_t rows, int64_t dim, float* y);

/// Packed cache rows: x [rows, dim] -> out [rows, *_row_bytes(dim)] and back.
DSV41RT_API void fp8_window_pack(const float* x, int64_t rows, int64_t dim, uint8_t* out);
DSV41RT_API void fp8_window_unpack(const uint8_t* in, int64_t rows, int64_t dim, float* y);
DSV41RT_API void nvfp4_pack(const float* x, int64_t rows, int64_t dim, uint8_t* out);
DSV41RT_API void nvfp4_unpack(const uint8_t* in, int64_t rows, int64_t dim, float* y);
DSV41RT_API void mxfp4_pack(const float* x, int64_t rows, int64_t dim, uint8_t* out);
DSV41RT_API void mxfp4_unpack(const uint8_t* in, int64_t rows, int64_t dim, float* y);
DSV41RT_API void v4_row_pack(const float* x, int64_t rows, int64_t dim, uint8_t* out);
DSV41RT_API void v4_row_unpack(const uint8_t* in, int64_t rows, int64_t dim, float* y);

/// FP8 E4M3 weight with UE8M0 block scales -> out [rows, cols] FP32.
DSV41RT_API void dequant_fp8_blocks(const uint8_t* codes, const uint8_t* scales, int64_t rows,
                                    int64_t cols, int64_t block_rows, int64_t block_cols,
                                    float* out);
/// Packed E2M1 weight with per-row UE8M0 scales over 32 columns -> out [rows, cols] FP32.
DSV41RT_API void dequant_fp4_rows(const uint8_t* packed, const uint8_t* scales, int64_t rows,
                                  int64_t cols, float* out);
/// BF16 -> FP32.
DSV41RT_API void dequant_bf16(const uint16_t* in, int64_t n, float* out);

}  // namespace dsv41rt::kernels::cpu
