// Contract: a weight matrix as the checkpoint stores it, the one description every backend's
// matrix ops read (spec section 5.1 of the architecture note; no expansion at load).
//
//   kF32       float [rows, cols]
//   kBF16      BF16 bits [rows, cols]
//   kFp8Block  E4M3 codes [rows, cols] + UE8M0 scales [ceil(rows / block_rows),
//              ceil(cols / block_cols)] (V4.1: 32 x 32; V4: 128 x 128; partial edge blocks allowed)
//   kMxfp4     E2M1 packed [rows, cols / 2] (even column in the low nibble) + UE8M0 scales
//              [rows, ceil(cols / 32)]; cols even. Code 8 (-0) decodes to +0 (NeMo's table).
//   value(r, c) = decoded code * 2^(scale - 127) (UE8M0 0 is 2^-127, 255 NaN), exactly as
//   kernels/cpu/quant.h dequant_fp8_blocks / dequant_fp4_rows.
//
// A stack of equal matrices (routed experts [E, I, H], grouped projections [g, n, k]) is one view
// of E * I rows: matrix e, row r is row e * I + r. For kFp8Block that needs I % block_rows == 0
// (checked where stacks are built), so every matrix starts on a scale-block boundary.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace dsv41rt::kernels {

enum class WeightFormat : int32_t {
  kF32 = 0,
  kBF16 = 1,
  kFp8Block = 2,
  kMxfp4 = 3,
};

inline constexpr int64_t kMxfp4WeightBlock = 32;

/// 2^p as a float, for p in [-126, 127] (built from its exponent bits: no rounding, no branch).
DSV41RT_HOST_DEVICE inline float pow2_normal(int p) {
  return f32_from_bits(static_cast<uint32_t>(p + 127) << 23);
}

// Fast exact decodes for GEMM staging: code times 2^(e - 127) as integer magnitude times a power
// of two (one int-to-float, one multiply, no branches), equal to WeightView::value() bitwise for
// every code of the format (FP8: but the NaN codes 0x7F / 0xFF) whenever the scale code e lies in
// the stated range (results are normal floats or zero; at the very top both overflow to inf
// alike); outside it, use value(). Checked exhaustively in tests/cpp/test_weight_view.cc.
inline constexpr int kFp8FastScaleMin = 10, kFp8FastScaleMax = 249;
inline constexpr int kFp4FastScaleMin = 2, kFp4FastScaleMax = 250;

/// E4M3 code c: magnitude M * 2^(max(exp, 1) - 10) with M = 8 + mantissa (normal) or mantissa.
DSV41RT_HOST_DEVICE inline float fp8_scaled_value(uint8_t c, int e) {
  const int ex = (c >> 3) & 0xF, m = c & 7;
  const int mag = ex ? 8 + m : m;
  const float v = static_cast<float>(mag) * pow2_normal((ex ? ex : 1) - 10 + e - 127);
  return (c & 0x80) ? -v : v;
}

/// E2M1 nibble n: magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6} = {0, 1, 2, 3, 4, 6, 8, 12} / 2; code 8
/// (-0) gives +0 as NeMo's table.
DSV41RT_HOST_DEVICE inline float fp4_scaled_value(uint8_t n, int e) {
  const int k = n & 7;
  const int mag = k < 4 ? k : (k == 7 ? 12 : 4 + 2 * (k - 4));  // 0 1 2 3 4 6 8 12
  const float v = static_cast<float>(mag) * pow2_normal(e - 128);
  return (n & 8) && mag ? -v : v;
}

struct WeightView {
  const void* data = nullptr;
  const uint8_t* scale = nullptr;  ///< kFp8Block / kMxfp4 only
  WeightFormat format = WeightFormat::kF32;
  int32_t block_rows = 0, block_cols = 0;  ///< kFp8Block scale blocks
  int64_t rows = 0, cols = 0;              ///< the whole (stacked) 2-D matrix

  DSV41RT_HOST_DEVICE int64_t scale_cols() const {
    if (format == WeightFormat::kFp8Block) return (cols + block_cols - 1) / block_cols;
    if (format == WeightFormat::kMxfp4) return (cols + kMxfp4WeightBlock - 1) / kMxfp4WeightBlock;
    return 0;
  }
  DSV41RT_HOST_DEVICE int64_t scale_rows() const {
    if (format == WeightFormat::kFp8Block) return (rows + block_rows - 1) / block_rows;
    if (format == WeightFormat::kMxfp4) return rows;
    return 0;
  }
  /// Bytes of the codes and of the scales.
  DSV41RT_HOST_DEVICE int64_t data_bytes() const {
    switch (format) {
      case WeightFormat::kF32:
        return rows * cols * 4;
      case WeightFormat::kBF16:
        return rows * cols * 2;
      case WeightFormat::kFp8Block:
        return rows * cols;
      case WeightFormat::kMxfp4:
        return rows * (cols / 2);
    }
    return 0;
  }
  DSV41RT_HOST_DEVICE int64_t scale_bytes() const { return scale_rows() * scale_cols(); }

  /// The FP32 value of element (r, c) (reference decode; fast kernels decode whole vectors).
  DSV41RT_HOST_DEVICE float value(int64_t r, int64_t c) const {
    switch (format) {
      case WeightFormat::kF32:
        return static_cast<const float*>(data)[r * cols + c];
      case WeightFormat::kBF16:
        return bf16_to_f32(static_cast<const uint16_t*>(data)[r * cols + c]);
      case WeightFormat::kFp8Block: {
        const uint8_t code = static_cast<const uint8_t*>(data)[r * cols + c];
        const uint8_t e = scale[(r / block_rows) * scale_cols() + c / block_cols];
        return fp8_e4m3_to_f32(code) * e8m0_to_f32(e);
      }
      case WeightFormat::kMxfp4: {
        const uint8_t byte = static_cast<const uint8_t*>(data)[r * (cols / 2) + c / 2];
        const uint8_t code = (c & 1) ? uint8_t(byte >> 4) : uint8_t(byte & 0xF);
        const float v = code == 8 ? 0.0f : fp4_e2m1_to_f32(code);
        return v * e8m0_to_f32(scale[r * scale_cols() + c / kMxfp4WeightBlock]);
      }
    }
    return 0.0f;
  }
};

}  // namespace dsv41rt::kernels
