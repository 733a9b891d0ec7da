// Device codec of DeepSeek-V4's 584-byte cache rows (kernels/quant.h v4_row_*), shared by the
// paged ops (paged.cu) and the cache QDQ (quant.cu). Internal to kernels/cuda: bit for bit
// kernels/cpu/quant.cc's v4_row_pack / v4_row_unpack / v4_row_qdq.
//
// A row is one warp's: the 64-channel FP8 blocks are wider than a warp, so each lane holds two
// channels of a block (c and c + 32) and the block amax is a full-warp max reduction (exact and
// order-independent, as quant_device.cuh's); the scale and the element codes are fp8_window's
// device functions (the block size is the only difference, as on the CPU).
#pragma once

#include <cstdint>

#include "kernels/cuda/quant_device.cuh"
#include "kernels/quant.h"

namespace dsv41rt::kernels::cuda::v4dev {

constexpr int kBlocks = int(kV4RowNope / kV4RowBlock);    // 7
constexpr int64_t kTail = kV4RowNope + kV4RowScaleBytes;  // byte offset of the BF16 part
static_assert(kV4RowBlock == 64 && kV4RowDim - kV4RowNope == 64, "two channels a lane");

// Scale and codes of block k's channels (v0 = channel k*64 + lane, v1 = k*64 + 32 + lane). All 32
// lanes of the warp call it with the same k.
__device__ __forceinline__ qdev::Quantized quantize_block(float v0, float v1, uint8_t* code1) {
  using qdev::Format;
  const uint32_t m =
      __reduce_max_sync(qdev::kFullMask, max(qdev::abs_bits(v0), qdev::abs_bits(v1)));
  qdev::Quantized q;
  qdev::block_scale<Format::kFp8Window>(qdev::amax_of_bits(m), q);
  q.code = qdev::element_code<Format::kFp8Window>(v0, q.s);
  *code1 = qdev::element_code<Format::kFp8Window>(v1, q.s);
  return q;
}

/// Packs the row x [512] into row [584]; all 32 lanes of the warp call it (lane = threadIdx & 31).
__device__ __forceinline__ void pack_row(const float* x, uint8_t* row, int lane) {
  for (int k = 0; k < kBlocks; ++k) {
    const int c = k * int(kV4RowBlock) + lane;
    uint8_t code1;
    const qdev::Quantized q = quantize_block(x[c], x[c + 32], &code1);
    row[c] = q.code;
    row[c + 32] = code1;
    if (lane == 0) row[kV4RowNope + k] = q.scale_code;
  }
  if (lane == 0) row[kV4RowNope + kBlocks] = 0;  // the pad byte, as the CPU writes it
  for (int j = lane; j < int(kV4RowDim - kV4RowNope); j += 32) {
    const uint16_t b = f32_to_bf16(x[kV4RowNope + j]);  // little-endian, as the CPU stores it
    row[kTail + 2 * j] = uint8_t(b & 0xFFu);
    row[kTail + 2 * j + 1] = uint8_t(b >> 8);
  }
}

/// y [512] = QDQ(x [512]) (y may alias x: every lane reads its channels before writing them).
__device__ __forceinline__ void qdq_row(const float* x, float* y, int lane) {
  for (int k = 0; k < kBlocks; ++k) {
    const int c = k * int(kV4RowBlock) + lane;
    uint8_t code1;
    const qdev::Quantized q = quantize_block(x[c], x[c + 32], &code1);
    y[c] = __fmul_rn(fp8_e4m3_to_f32(q.code), q.s);
    y[c + 32] = __fmul_rn(fp8_e4m3_to_f32(code1), q.s);
  }
  for (int j = lane; j < int(kV4RowDim - kV4RowNope); j += 32) {
    y[kV4RowNope + j] = bf16_to_f32(f32_to_bf16(x[kV4RowNope + j]));
  }
}

/// Channel c of a packed row (any thread).
__device__ __forceinline__ float unpack_element(const uint8_t* row, int64_t c) {
  if (c < kV4RowNope) {
    return __fmul_rn(fp8_e4m3_to_f32(row[c]), e8m0_to_f32(row[kV4RowNope + c / kV4RowBlock]));
  }
  const int64_t i = kTail + 2 * (c - kV4RowNope);
  return bf16_to_f32(uint16_t(row[i] | (uint16_t(row[i + 1]) << 8)));
}

}  // namespace dsv41rt::kernels::cuda::v4dev
