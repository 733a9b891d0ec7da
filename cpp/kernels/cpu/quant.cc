#include "kernels/quant.h"

#include <cmath>
#include <limits>

#include "core/dtype.h"
#include "core/status.h"

namespace dsv41rt::kernels::cpu {
namespace {

// Python scalars reach torch's FP32 kernels as static_cast<float>(double): mirror that exactly.
const float kFp8AmaxFloor = static_cast<float>(1e-4);
const float kInv448 = static_cast<float>(1.0 / 448.0);
constexpr float kNvfp4AmaxFloor = 6.0f * 0.001953125f;  // 6 * 2^-9, exact
const float kMxfp4AmaxFloor = std::ldexp(6.0f, -126);   // 6 * 2^-126, exact (normal)
const float kInv6 = static_cast<float>(1.0 / 6.0);
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// NeMo `_power_of_two_ceiling`: ((exponent + (mantissa != 0)) << 23) on the int32 view. Exact for
// positive normals; a subnormal gives 2^-126, inf stays inf, NaN wraps to 0x80000000 (-0.0).
inline float pow2ceil_bits(float v) {
  const uint32_t bits = f32_to_bits(v);
  const uint32_t exponent = (bits >> 23) & 255u;
  const uint32_t increment = (bits & 0x7FFFFFu) != 0 ? 1u : 0u;
  return f32_from_bits((exponent + increment) << 23);
}

// torch amax(|x|): NaN if any element is NaN.
inline float block_amax(const float* x, int64_t n) {
  float m = 0.0f;
  bool nan = false;
  for (int64_t i = 0; i < n; ++i) {
    const float a = std::fabs(x[i]);
    if (a != a) nan = true;
    if (a > m) m = a;
  }
  return nan ? kNaN : m;
}

// torch clamp_min / clamp: NaN propagates.
inline float clamp_min(float v, float lo) { return v < lo ? lo : v; }
inline float clamp(float v, float lo, float hi) { return v < lo ? lo : (v > hi ? hi : v); }

// E2M1 code of a clamped, scale-normalised value, as NeMo rounds it: magnitude to the nearest
// level with ties to the even code (torch.bucketize puts NaN past the last midpoint -> level 6),
// sign of the input kept (copysign), so -0 / negative values rounding to zero give code 8.
inline uint8_t e2m1_code(float n) {
  const float mag = std::fabs(n);
  const uint8_t c = mag != mag ? uint8_t{7} : f32_to_fp4_e2m1(mag);
  return static_cast<uint8_t>(std::signbit(n) ? (c | 0x8u) : c);
}

inline bool all_finite(float amax) { return amax <= std::numeric_limits<float>::max(); }

// kFp8B64 is V4's nope part (spec 5.4): fp8_window's rule in blocks of 64 (the block size is
// the only difference; v4_row_* below add the BF16 tail and the row layout).
enum class Format { kFp8Window, kNvfp4, kMxfp4, kFp8B64 };

template <Format F>
constexpr bool is_fp8() {
  return F == Format::kFp8Window || F == Format::kFp8B64;
}

template <Format F>
constexpr int64_t block_size() {
  return F == Format::kFp8B64      ? kV4RowBlock
         : F == Format::kFp8Window ? kFp8WindowBlock
                                   : (F == Format::kNvfp4 ? kNvfp4Block : kMxfp4Block);
}

template <Format F>
constexpr const char* format_name() {
  return F == Format::kFp8B64      ? "v4_row"
         : F == Format::kFp8Window ? "fp8_window"
                                   : (F == Format::kNvfp4 ? "nvfp4" : "mxfp4");
}

template <Format F>
void check_dims(const char* op, int64_t rows, int64_t dim) {
  constexpr int64_t b = block_size<F>();
  DSV41RT_CHECK(rows >= 0, op, ": rows must be >= 0, got ", rows);
  DSV41RT_CHECK(dim > 0 && dim % b == 0, op, ": dim ", dim, " is not a positive multiple of the ",
                format_name<F>(), " block size ", b);
}

// One block: computes NeMo's FP32 scale `s` and its storage code, and the element codes.
// Returns s. For fp8_window/mxfp4 the storage code of a non-finite block is 0xFF (NaN).
template <Format F>
float quantize_block(const float* x, uint8_t* codes, uint8_t* scale_code) {
  constexpr int64_t b = block_size<F>();
  const float amax = block_amax(x, b);
  float s;
  if constexpr (F == Format::kNvfp4) {
    *scale_code = f32_to_fp8_e4m3(clamp_min(amax, kNvfp4AmaxFloor) / 6.0f);  // saturating RNE
    s = fp8_e4m3_to_f32(*scale_code);
  } else {
    const float floor = is_fp8<F>() ? kFp8AmaxFloor : kMxfp4AmaxFloor;
    const float inv = is_fp8<F>() ? kInv448 : kInv6;
    s = pow2ceil_bits(clamp_min(amax, floor) * inv);
    *scale_code = all_finite(amax) ? static_cast<uint8_t>(f32_to_bits(s) >> 23) : kE8M0Nan;
  }
  for (int64_t i = 0; i < b; ++i) {
    const float q = x[i] / s;  // true division, as NeMo (grouped / scale)
    if constexpr (is_fp8<F>()) {
      codes[i] = f32_to_fp8_e4m3(clamp(q, -448.0f, 448.0f));
    } else {
      codes[i] = e2m1_code(clamp(q, -6.0f, 6.0f));
    }
  }
  return s;
}

template <Format F>
inline float decode_element(uint8_t code) {
  if constexpr (is_fp8<F>()) {
    return fp8_e4m3_to_f32(code);
  } else {
    return fp4_e2m1_to_f32(code);
  }
}

template <Format F>
void qdq(const float* x, int64_t rows, int64_t dim, float* y, const char* op) {
  check_dims<F>(op, rows, dim);
  constexpr int64_t b = block_size<F>();
  const int64_t blocks = rows * (dim / b);
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    uint8_t codes[b];
    uint8_t sc;
    const float s = quantize_block<F>(x + blk * b, codes, &sc);
    for (int64_t i = 0; i < b; ++i) y[blk * b + i] = decode_element<F>(codes[i]) * s;
  }
}

template <Format F>
constexpr int64_t row_bytes(int64_t dim) {
  return F == Format::kFp8Window
             ? fp8_window_row_bytes(dim)
             : (F == Format::kNvfp4 ? nvfp4_row_bytes(dim) : mxfp4_row_bytes(dim));
}

template <Format F>
constexpr int64_t data_bytes(int64_t dim) {
  return F == Format::kFp8Window ? dim : dim / 2;
}

template <Format F>
void pack(const float* x, int64_t rows, int64_t dim, uint8_t* out, const char* op) {
  check_dims<F>(op, rows, dim);
  constexpr int64_t b = block_size<F>();
  const int64_t nb = dim / b, rb = row_bytes<F>(dim), db = data_bytes<F>(dim);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* row = out + r * rb;
    for (int64_t k = 0; k < nb; ++k) {
      uint8_t codes[b];
      quantize_block<F>(x + r * dim + k * b, codes, row + db + k);
      if constexpr (F == Format::kFp8Window) {
        for (int64_t i = 0; i < b; ++i) row[k * b + i] = codes[i];
      } else {
        for (int64_t i = 0; i < b / 2; ++i) {
          row[(k * b) / 2 + i] = fp4_pack(codes[2 * i], codes[2 * i + 1]);
        }
      }
    }
  }
}

template <Format F>
void unpack(const uint8_t* in, int64_t rows, int64_t dim, float* y, const char* op) {
  check_dims<F>(op, rows, dim);
  constexpr int64_t b = block_size<F>();
  const int64_t nb = dim / b, rb = row_bytes<F>(dim), db = data_bytes<F>(dim);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* row = in + r * rb;
    float* yr = y + r * dim;
    for (int64_t k = 0; k < nb; ++k) {
      const uint8_t sc = row[db + k];
      const float s = F == Format::kNvfp4 ? fp8_e4m3_to_f32(sc) : e8m0_to_f32(sc);
      for (int64_t i = 0; i < b; ++i) {
        const int64_t c = k * b + i;
        uint8_t code;
        if constexpr (F == Format::kFp8Window) {
          code = row[c];
        } else {
          code = (c & 1) ? fp4_unpack_hi(row[c / 2]) : fp4_unpack_lo(row[c / 2]);
        }
        yr[c] = decode_element<F>(code) * s;
      }
    }
  }
}

// ---- DeepSeek-V4 rows: the nope part through the fp8 block codec above (block 64), the rope
// tail rounded to BF16. The scale bytes sit after the nope codes, the pad byte is written 0.

void check_v4_dims(const char* op, int64_t rows, int64_t dim) {
  DSV41RT_CHECK(rows >= 0, op, ": rows must be >= 0, got ", rows);
  DSV41RT_CHECK(dim == kV4RowDim, op, ": dim ", dim, " is not DeepSeek-V4's row width ", kV4RowDim,
                " (", kV4RowNope, " FP8 channels in blocks of ", kV4RowBlock, " + ",
                kV4RowDim - kV4RowNope, " BF16; spec 5.4)");
}

constexpr int64_t kV4Blocks = kV4RowNope / kV4RowBlock;  // 7

// One row's codec: encode_v4_row writes the 584-byte row and returns each block's FP32 scale
// `s` (NeMo's, from quantize_block); decode_v4_row decodes a row with the given block scales.
// v4_row_unpack decodes with the stored scale codes; v4_row_qdq with the encoder's scales. The
// two agree bitwise for finite blocks (s is a positive normal power of two, e8m0(code) == s);
// a non-finite block's stored code is 0xFF (NaN) while NeMo's s is -0 (NaN in the block) or inf
// (quant.h), so qdq must decode with s to keep NeMo's arithmetic.
void encode_v4_row(const float* xr, uint8_t* row, float* scales) {
  for (int64_t k = 0; k < kV4Blocks; ++k) {
    scales[k] = quantize_block<Format::kFp8B64>(xr + k * kV4RowBlock, row + k * kV4RowBlock,
                                                row + kV4RowNope + k);
  }
  for (int64_t k = kV4Blocks; k < kV4RowScaleBytes; ++k) row[kV4RowNope + k] = 0;
  uint8_t* tail = row + kV4RowNope + kV4RowScaleBytes;
  for (int64_t c = kV4RowNope; c < kV4RowDim; ++c) {
    const uint16_t b = f32_to_bf16(xr[c]);
    tail[2 * (c - kV4RowNope)] = uint8_t(b & 0xFFu);
    tail[2 * (c - kV4RowNope) + 1] = uint8_t(b >> 8);
  }
}

void decode_v4_row(const uint8_t* row, const float* scales, float* yr) {
  for (int64_t c = 0; c < kV4RowNope; ++c) {
    // scale * code, v4_row_unpack's order before the codec was shared: where both are NaN (scale
    // code 0xFF and a NaN element code) x86 keeps one operand's NaN, with this order the scale's.
    yr[c] = scales[c / kV4RowBlock] * decode_element<Format::kFp8B64>(row[c]);
  }
  const uint8_t* tail = row + kV4RowNope + kV4RowScaleBytes;
  for (int64_t c = kV4RowNope; c < kV4RowDim; ++c) {
    const int64_t i = 2 * (c - kV4RowNope);
    yr[c] = bf16_to_f32(uint16_t(tail[i] | (uint16_t(tail[i + 1]) << 8)));
  }
}

}  // namespace

// qdq is pack + decode: one codec (encode_v4_row), the row held in a local buffer (so x == y
// works in place).
void v4_row_qdq(const float* x, int64_t rows, int64_t dim, float* y) {
  check_v4_dims("v4_row_qdq", rows, dim);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t row[kV4RowBytes];
    float scales[kV4Blocks];
    encode_v4_row(x + r * dim, row, scales);
    decode_v4_row(row, scales, y + r * dim);
  }
}

void v4_row_pack(const float* x, int64_t rows, int64_t dim, uint8_t* out) {
  check_v4_dims("v4_row_pack", rows, dim);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    float scales[kV4Blocks];
    encode_v4_row(x + r * dim, out + r * kV4RowBytes, scales);
  }
}

void v4_row_unpack(const uint8_t* in, int64_t rows, int64_t dim, float* y) {
  check_v4_dims("v4_row_unpack", rows, dim);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* row = in + r * kV4RowBytes;
    float scales[kV4Blocks];
    for (int64_t k = 0; k < kV4Blocks; ++k) scales[k] = e8m0_to_f32(row[kV4RowNope + k]);
    decode_v4_row(row, scales, y + r * dim);
  }
}

void fp8_window_qdq(const float* x, int64_t rows, int64_t dim, float* y) {
  qdq<Format::kFp8Window>(x, rows, dim, y, "fp8_window_qdq");
}
void fp8_act_qdq(const float* x, int64_t rows, int64_t dim, float* y) {
  DSV41RT_CHECK(rows >= 0 && dim > 0 && dim % kFp8WindowBlock == 0, "fp8_act_qdq: rows=", rows,
                " dim=", dim, " (dim must be a positive multiple of 32)");
  for (int64_t i = 0; i < rows * dim; ++i) y[i] = bf16_to_f32(f32_to_bf16(x[i]));
  fp8_window_qdq(y, rows, dim, y);
}
void nvfp4_qdq(const float* x, int64_t rows, int64_t dim, float* y) {
  qdq<Format::kNvfp4>(x, rows, dim, y, "nvfp4_qdq");
}
void mxfp4_qdq(const float* x, int64_t rows, int64_t dim, float* y) {
  qdq<Format::kMxfp4>(x, rows, dim, y, "mxfp4_qdq");
}

void fp8_window_pack(const float* x, int64_t rows, int64_t dim, uint8_t* out) {
  pack<Format::kFp8Window>(x, rows, dim, out, "fp8_window_pack");
}
void fp8_window_unpack(const uint8_t* in, int64_t rows, int64_t dim, float* y) {
  unpack<Format::kFp8Window>(in, rows, dim, y, "fp8_window_unpack");
}
void nvfp4_pack(const float* x, int64_t rows, int64_t dim, uint8_t* out) {
  pack<Format::kNvfp4>(x, rows, dim, out, "nvfp4_pack");
}
void nvfp4_unpack(const uint8_t* in, int64_t rows, int64_t dim, float* y) {
  unpack<Format::kNvfp4>(in, rows, dim, y, "nvfp4_unpack");
}
void mxfp4_pack(const float* x, int64_t rows, int64_t dim, uint8_t* out) {
  pack<Format::kMxfp4>(x, rows, dim, out, "mxfp4_pack");
}
void mxfp4_unpack(const uint8_t* in, int64_t rows, int64_t dim, float* y) {
  unpack<Format::kMxfp4>(in, rows, dim, y, "mxfp4_unpack");
}

void dequant_fp8_blocks(const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t cols,
                        int64_t block_rows, int64_t block_cols, float* out) {
  DSV41RT_CHECK(rows >= 0 && cols >= 0, "dequant_fp8_blocks: negative shape [", rows, ", ", cols,
                "]");
  DSV41RT_CHECK(block_rows > 0 && block_cols > 0,
                "dequant_fp8_blocks: block sizes must be positive, got ", block_rows, "x",
                block_cols);
  const int64_t scale_cols = (cols + block_cols - 1) / block_cols;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* srow = scales + (r / block_rows) * scale_cols;
    for (int64_t c = 0; c < cols; ++c) {
      out[r * cols + c] = fp8_e4m3_to_f32(codes[r * cols + c]) * e8m0_to_f32(srow[c / block_cols]);
    }
  }
}

void dequant_fp4_rows(const uint8_t* packed, const uint8_t* scales, int64_t rows, int64_t cols,
                      float* out) {
  DSV41RT_CHECK(rows >= 0 && cols >= 0, "dequant_fp4_rows: negative shape [", rows, ", ", cols,
                "]");
  DSV41RT_CHECK(cols % 2 == 0, "dequant_fp4_rows: cols ", cols,
                " is odd (two E2M1 values per byte)");
  const int64_t scale_cols = (cols + 31) / 32;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const uint8_t byte = packed[r * (cols / 2) + c / 2];
      const uint8_t code = (c & 1) ? fp4_unpack_hi(byte) : fp4_unpack_lo(byte);
      const float v = code == 8 ? 0.0f : fp4_e2m1_to_f32(code);  // NeMo's table: code 8 -> +0
      out[r * cols + c] = v * e8m0_to_f32(scales[r * scale_cols + c / 32]);
    }
  }
}

void dequant_bf16(const uint16_t* in, int64_t n, float* out) {
  DSV41RT_CHECK(n >= 0, "dequant_bf16: n must be >= 0, got ", n);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(in[i]);
}

}  // namespace dsv41rt::kernels::cpu
