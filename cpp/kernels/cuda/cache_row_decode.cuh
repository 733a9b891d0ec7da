// Device decode of stored cache rows (kernels/paged.h RowFormat) in pieces of 16 channels, for
// kernels that read the caches in place (attention_keys.cuh, indexer_tc.cu). A piece's bytes are
// loaded first (load_row_piece: one 16- or 8-byte load where the row's alignment allows it), then
// decoded (decode_row_piece), so a caller can keep several loads in flight before decoding. The
// values are kernels/quant.h's codecs bitwise (paged.h decode_row): code times scale, one FP32
// product. Internal to kernels/cuda.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "kernels/paged.h"

namespace dsv41rt::kernels::cuda {

// `bytes` (8 or 16) of a stored row at p, with the widest loads its alignment allows (a row's
// alignment is the same for all its pieces, so the branch is uniform over a warp's row).
__device__ __forceinline__ uint4 load_piece(const uint8_t* p, int bytes) {
  uint4 r = make_uint4(0u, 0u, 0u, 0u);
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  if (bytes == 16 && a % 16 == 0) return *reinterpret_cast<const uint4*>(p);
  if (bytes == 8 && a % 8 == 0) {
    const uint2 v = *reinterpret_cast<const uint2*>(p);
    return make_uint4(v.x, v.y, 0u, 0u);
  }
  uint32_t w[4] = {0u, 0u, 0u, 0u};
  for (int i = 0; i < bytes; ++i) w[i / 4] |= uint32_t(p[i]) << (8 * (i % 4));
  r.x = w[0], r.y = w[1], r.z = w[2], r.w = w[3];
  return r;
}

__device__ __forceinline__ uint8_t byte_of(const uint4& r, int i) {
  const uint32_t w = i < 4 ? r.x : i < 8 ? r.y : i < 12 ? r.z : r.w;
  return static_cast<uint8_t>(w >> (8 * (i % 4)));
}

/// The codes and the scale code of channels [16 piece, + 16) of a stored row p of D channels in
/// format f (kFp8Window, kNvfp4 or kMxfp4; anything else leaves raw and sc zero).
__device__ __forceinline__ void load_row_piece(int f, const uint8_t* p, int piece, int D,
                                               uint4& raw, uint8_t& sc) {
  raw = make_uint4(0u, 0u, 0u, 0u);
  sc = 0;
  if (f == int(RowFormat::kFp8Window)) {
    raw = load_piece(p + piece * 16, 16);
    sc = p[D + piece / 2];
  } else if (f == int(RowFormat::kNvfp4) || f == int(RowFormat::kMxfp4)) {
    raw = load_piece(p + piece * 8, 8);
    sc = p[D / 2 + (f == int(RowFormat::kNvfp4) ? piece : piece / 2)];
  }
}

/// The 16 FP32 values of a piece load_row_piece loaded (zeros for another format).
__device__ __forceinline__ void decode_row_piece(int f, const uint4& raw, uint8_t sc, float v[16]) {
  if (f == int(RowFormat::kFp8Window)) {
    const float scale = e8m0_to_f32(sc);
#pragma unroll
    for (int e = 0; e < 16; ++e) v[e] = __fmul_rn(fp8_e4m3_to_f32(byte_of(raw, e)), scale);
  } else if (f == int(RowFormat::kNvfp4) || f == int(RowFormat::kMxfp4)) {
    const float scale = f == int(RowFormat::kNvfp4) ? fp8_e4m3_to_f32(sc) : e8m0_to_f32(sc);
#pragma unroll
    for (int e = 0; e < 16; ++e) {
      const uint8_t b = byte_of(raw, e / 2);
      const uint8_t code = (e & 1) ? fp4_unpack_hi(b) : fp4_unpack_lo(b);
      v[e] = __fmul_rn(fp4_e2m1_to_f32(code), scale);
    }
  } else {
#pragma unroll
    for (int e = 0; e < 16; ++e) v[e] = 0.0f;
  }
}

}  // namespace dsv41rt::kernels::cuda
