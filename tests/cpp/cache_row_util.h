// Cache rows in their stored formats for the Backend suites that build paged state by hand
// (test_backend_paged.cc, test_backend_attention_cached.cc): one row encoded / decoded by the
// codecs of kernels/quant.h, and the quantise-dequantise of many rows.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/paged.h"
#include "kernels/quant.h"

namespace dsv41rt::testing {

inline void encode_row(kernels::RowFormat f, const float* x, int64_t dim, uint8_t* out) {
  namespace k = kernels::cpu;
  using kernels::RowFormat;
  if (f == RowFormat::kF32) std::memcpy(out, x, size_t(dim) * 4);
  if (f == RowFormat::kFp8Window) k::fp8_window_pack(x, 1, dim, out);
  if (f == RowFormat::kNvfp4) k::nvfp4_pack(x, 1, dim, out);
  if (f == RowFormat::kMxfp4) k::mxfp4_pack(x, 1, dim, out);
}

inline void decode_row(kernels::RowFormat f, const uint8_t* row, int64_t dim, float* out) {
  namespace k = kernels::cpu;
  using kernels::RowFormat;
  if (f == RowFormat::kF32) std::memcpy(out, row, size_t(dim) * 4);
  if (f == RowFormat::kFp8Window) k::fp8_window_unpack(row, 1, dim, out);
  if (f == RowFormat::kNvfp4) k::nvfp4_unpack(row, 1, dim, out);
  if (f == RowFormat::kMxfp4) k::mxfp4_unpack(row, 1, dim, out);
}

/// Rows [x.size() / dim, dim] through the format's quantiser and back (kF32: unchanged).
inline std::vector<float> host_qdq(kernels::RowFormat f, std::vector<float> x, int64_t dim) {
  namespace k = kernels::cpu;
  using kernels::RowFormat;
  const int64_t rows = int64_t(x.size()) / dim;
  if (f == RowFormat::kFp8Window) k::fp8_window_qdq(x.data(), rows, dim, x.data());
  if (f == RowFormat::kNvfp4) k::nvfp4_qdq(x.data(), rows, dim, x.data());
  if (f == RowFormat::kMxfp4) k::mxfp4_qdq(x.data(), rows, dim, x.data());
  return x;
}

}  // namespace dsv41rt::testing
