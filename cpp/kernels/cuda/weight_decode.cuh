// Device decoding of weights in their stored formats (kernels/weight_view.h), shared by the GEMM
// kernels that read WeightViews. Internal to kernels/cuda. Every value equals WeightView::value
// (the CPU's dequantisation) bit for bit: E4M3 / E2M1 codes times a power of two are exact in
// FP32, and exact in BF16 while they stay in BF16's normal range (every real checkpoint value).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"
#include "kernels/weight_view.h"

namespace dsv41rt::kernels::cuda {

using kernels::WeightFormat;
using kernels::WeightView;

/// Element (r, c) of `w` in FP32.
template <WeightFormat F>
__device__ __forceinline__ float weight_at(const WeightView& w, int64_t r, int64_t c) {
  if constexpr (F == WeightFormat::kF32) {
    return static_cast<const float*>(w.data)[r * w.cols + c];
  } else if constexpr (F == WeightFormat::kBF16) {
    return bf16_to_f32(static_cast<const uint16_t*>(w.data)[r * w.cols + c]);
  } else if constexpr (F == WeightFormat::kFp8Block) {
    const uint8_t code = static_cast<const uint8_t*>(w.data)[r * w.cols + c];
    const int64_t sc = (w.cols + w.block_cols - 1) / w.block_cols;
    const uint8_t e = w.scale[(r / w.block_rows) * sc + c / w.block_cols];
    if (e >= kFp8FastScaleMin && e <= kFp8FastScaleMax && (code & 0x7F) != 0x7F) {
      return fp8_scaled_value(code, e);
    }
    return __fmul_rn(fp8_e4m3_to_f32(code), e8m0_to_f32(e));
  } else {
    const uint8_t byte = static_cast<const uint8_t*>(w.data)[r * (w.cols / 2) + c / 2];
    const uint8_t code = (c & 1) ? uint8_t(byte >> 4) : uint8_t(byte & 0xF);
    const int64_t sc = (w.cols + kMxfp4WeightBlock - 1) / kMxfp4WeightBlock;
    const uint8_t e = w.scale[r * sc + c / kMxfp4WeightBlock];
    if (e >= kFp4FastScaleMin && e <= kFp4FastScaleMax) return fp4_scaled_value(code, e);
    const float v = code == 8 ? 0.0f : fp4_e2m1_to_f32(code);
    return __fmul_rn(v, e8m0_to_f32(e));
  }
}

/// Whether weight_bf16x8 may read `w` with vector loads: every row and every 8-column group
/// aligned, and (FP8) 8 columns never straddle a scale block.
__host__ __device__ inline bool weight_vec8_ok(const WeightView& w) {
  const auto base = reinterpret_cast<uintptr_t>(w.data);
  if (w.cols % 8 != 0) return false;
  switch (w.format) {
    case WeightFormat::kF32:
      return base % 16 == 0;
    case WeightFormat::kBF16:
      return base % 16 == 0;
    case WeightFormat::kFp8Block:
      return base % 8 == 0 && w.block_cols % 8 == 0;
    case WeightFormat::kMxfp4:
      return base % 4 == 0;
  }
  return false;
}

/// 8 BF16 codes packed two per word (element 0 in the low half of the first word).
__device__ __forceinline__ uint4 pack_bf16x8(const uint16_t (&h)[8]) {
  return make_uint4(h[0] | (uint32_t(h[1]) << 16), h[2] | (uint32_t(h[3]) << 16),
                    h[4] | (uint32_t(h[5]) << 16), h[6] | (uint32_t(h[7]) << 16));
}

/// 8 E4M3 codes (q.x holds codes 0..3, low byte first) times 2^(se - 127) as BF16 codes.
__device__ __forceinline__ uint4 bf16x8_of_fp8(uint2 q, uint8_t se) {
  // The fast exact decode and the hardware BF16 conversion (exact here) for every real scale;
  // the general (branchy) path only for the rest and for NaN codes.
  const bool fast = se >= kFp8FastScaleMin && se <= kFp8FastScaleMax;
  uint16_t h[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const uint8_t code = uint8_t(((e < 4 ? q.x : q.y) >> (8 * (e % 4))) & 0xFF);
    if (fast && (code & 0x7F) != 0x7F) {
      h[e] = __bfloat16_as_ushort(__float2bfloat16_rn(fp8_scaled_value(code, se)));
    } else {
      h[e] = f32_to_bf16(__fmul_rn(fp8_e4m3_to_f32(code), e8m0_to_f32(se)));
    }
  }
  return pack_bf16x8(h);
}

/// 8 E2M1 nibbles (nibble e of q is element e) times 2^(se - 127) as BF16 codes.
__device__ __forceinline__ uint4 bf16x8_of_fp4(uint32_t q, uint8_t se) {
  const bool fast = se >= kFp4FastScaleMin && se <= kFp4FastScaleMax;
  uint16_t h[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const uint8_t code = uint8_t((q >> (4 * e)) & 0xF);
    if (fast) {
      h[e] = __bfloat16_as_ushort(__float2bfloat16_rn(fp4_scaled_value(code, se)));
    } else {
      h[e] = f32_to_bf16(__fmul_rn(code == 8 ? 0.0f : fp4_e2m1_to_f32(code), e8m0_to_f32(se)));
    }
  }
  return pack_bf16x8(h);
}

/// 8 FP32 values rounded to BF16 codes (f32_to_bf16).
__device__ __forceinline__ uint4 bf16x8_of_f32(float4 a, float4 b) {
  const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
  uint16_t h[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) h[e] = f32_to_bf16(v[e]);
  return pack_bf16x8(h);
}

/// The scale code of `w` (kFp8Block / kMxfp4) for element (r, c).
template <WeightFormat F>
__device__ __forceinline__ uint8_t weight_scale_code(const WeightView& w, int64_t r, int64_t c) {
  if constexpr (F == WeightFormat::kFp8Block) {
    const int64_t sc = (w.cols + w.block_cols - 1) / w.block_cols;
    return w.scale[(r / w.block_rows) * sc + c / w.block_cols];
  } else {
    const int64_t sc = (w.cols + kMxfp4WeightBlock - 1) / kMxfp4WeightBlock;
    return w.scale[r * sc + c / kMxfp4WeightBlock];
  }
}

/// Weights [r, c .. c + 8) as 8 BF16 codes (c % 8 == 0, c + 8 <= cols, weight_vec8_ok).
template <WeightFormat F>
__device__ __forceinline__ uint4 weight_bf16x8(const WeightView& w, int64_t r, int64_t c) {
  if constexpr (F == WeightFormat::kBF16) {
    return *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(w.data) + r * w.cols + c);
  } else if constexpr (F == WeightFormat::kF32) {
    const float* p = static_cast<const float*>(w.data) + r * w.cols + c;
    return bf16x8_of_f32(*reinterpret_cast<const float4*>(p),
                         *reinterpret_cast<const float4*>(p + 4));
  } else if constexpr (F == WeightFormat::kFp8Block) {
    const uint2 q =
        *reinterpret_cast<const uint2*>(static_cast<const uint8_t*>(w.data) + r * w.cols + c);
    return bf16x8_of_fp8(q, weight_scale_code<F>(w, r, c));
  } else {
    const uint32_t q = *reinterpret_cast<const uint32_t*>(static_cast<const uint8_t*>(w.data) +
                                                          r * (w.cols / 2) + c / 2);
    return bf16x8_of_fp4(q, weight_scale_code<F>(w, r, c));
  }
}

/// Calls f.template operator()<F>() for the runtime format of `w` (one kernel instance each).
template <typename Fn>
decltype(auto) dispatch_format(WeightFormat format, Fn&& f) {
  switch (format) {
    case WeightFormat::kBF16:
      return f.template operator()<WeightFormat::kBF16>();
    case WeightFormat::kFp8Block:
      return f.template operator()<WeightFormat::kFp8Block>();
    case WeightFormat::kMxfp4:
      return f.template operator()<WeightFormat::kMxfp4>();
    case WeightFormat::kF32:
      break;
  }
  return f.template operator()<WeightFormat::kF32>();
}

}  // namespace dsv41rt::kernels::cuda
