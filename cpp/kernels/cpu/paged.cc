#include "kernels/paged.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "core/status.h"
#include "kernels/compressor.h"
#include "kernels/quant.h"

namespace dsv41rt::kernels {

int64_t row_bytes(RowFormat f, int64_t dim) {
  switch (f) {
    case RowFormat::kF32:
      return dim * int64_t(sizeof(float));
    case RowFormat::kFp8Window:
      return fp8_window_row_bytes(dim);
    case RowFormat::kNvfp4:
      return nvfp4_row_bytes(dim);
    case RowFormat::kMxfp4:
      return mxfp4_row_bytes(dim);
    case RowFormat::kV4Row:
      DSV41RT_CHECK(dim == kV4RowDim,
                    "row_bytes: DeepSeek-V4's row format (kV4Row) holds head_dim ", kV4RowDim,
                    " only, got dim ", dim);
      return kV4RowBytes;
  }
  DSV41RT_THROW_CODE(kInternal, "unknown row format ", int(f));
}

namespace cpu {
namespace {

void check_format(RowFormat f, int64_t dim, const char* op) {
  if (f == RowFormat::kV4Row) {
    DSV41RT_CHECK(dim == kV4RowDim, op, ": DeepSeek-V4's row format (kV4Row) holds head_dim ",
                  kV4RowDim, " only, got dim ", dim);
    return;
  }
  const int64_t block = f == RowFormat::kF32 ? 1 : f == RowFormat::kNvfp4 ? kNvfp4Block : 32;
  DSV41RT_CHECK(dim > 0 && dim % block == 0, op, ": dim ", dim, " is not a positive multiple of ",
                block, " for row format ", int(f));
}

void encode_row(RowFormat f, const float* x, int64_t dim, uint8_t* row) {
  switch (f) {
    case RowFormat::kF32:
      std::memcpy(row, x, size_t(dim) * sizeof(float));
      return;
    case RowFormat::kFp8Window:
      return fp8_window_pack(x, 1, dim, row);
    case RowFormat::kNvfp4:
      return nvfp4_pack(x, 1, dim, row);
    case RowFormat::kMxfp4:
      return mxfp4_pack(x, 1, dim, row);
    case RowFormat::kV4Row:
      return v4_row_pack(x, 1, dim, row);
  }
}

uint8_t* paged_row(const PagedRows& p, int64_t item, int64_t entry) {
  const int32_t page = p.page_table[item * p.max_pages + entry / p.per_page];
  return p.pool + int64_t(page) * p.page_bytes + p.offset + (entry % p.per_page) * p.row_bytes;
}

uint8_t* ring_row(const RingRows& r, int64_t item, int64_t position) {
  return r.slots[item] + r.offset + (position % r.ring) * r.row_bytes;
}

}  // namespace

void decode_row(RowFormat f, const uint8_t* row, int64_t dim, float* out) {
  switch (f) {
    case RowFormat::kF32:
      std::memcpy(out, row, size_t(dim) * sizeof(float));
      return;
    case RowFormat::kFp8Window:
      return fp8_window_unpack(row, 1, dim, out);
    case RowFormat::kNvfp4:
      return nvfp4_unpack(row, 1, dim, out);
    case RowFormat::kMxfp4:
      return mxfp4_unpack(row, 1, dim, out);
    case RowFormat::kV4Row:
      return v4_row_unpack(row, 1, dim, out);
  }
}

void unpack_paged(RowFormat f, const PagedRows& src, int64_t dim, int64_t items, int64_t max_count,
                  const int64_t* count, const int64_t* out_offset, float* out) {
  check_format(f, dim, "unpack_paged");
  for (int64_t b = 0; b < items; ++b) {
    for (int64_t j = 0; j < std::min(count[b], max_count); ++j) {
      decode_row(f, paged_row(src, b, j), dim, out + (out_offset[b] + j) * dim);
    }
  }
}

void pack_paged(RowFormat f, const PagedRows& dst, int64_t dim, int64_t n, const float* rows,
                const int32_t* item, const int64_t* entry) {
  check_format(f, dim, "pack_paged");
  for (int64_t i = 0; i < n; ++i) {
    if (item[i] >= 0) encode_row(f, rows + i * dim, dim, paged_row(dst, item[i], entry[i]));
  }
}

void unpack_ring(RowFormat f, const RingRows& src, int64_t dim, int64_t items, int64_t max_count,
                 const int64_t* first, const int64_t* count, const int64_t* out_offset,
                 float* out) {
  check_format(f, dim, "unpack_ring");
  DSV41RT_CHECK(src.ring > 0, "unpack_ring: ring of ", src.ring, " rows");
  for (int64_t b = 0; b < items; ++b) {
    for (int64_t j = 0; j < std::min(count[b], max_count); ++j) {
      decode_row(f, ring_row(src, b, first[b] + j), dim, out + (out_offset[b] + j) * dim);
    }
  }
}

void pack_ring(RowFormat f, const RingRows& dst, int64_t dim, int64_t n, const float* rows,
               const int32_t* item, const int64_t* positions, const uint8_t* store) {
  check_format(f, dim, "pack_ring");
  DSV41RT_CHECK(dst.ring > 0, "pack_ring: ring of ", dst.ring, " rows");
  for (int64_t i = 0; i < n; ++i) {
    if (item[i] >= 0 && store[i]) {
      encode_row(f, rows + i * dim, dim, ring_row(dst, item[i], positions[i]));
    }
  }
}

void compress_pool_gather(const float* values, const float* scores, uint8_t* const* slots,
                          int64_t pending_offset, int64_t groups, int64_t ratio, int64_t D,
                          const int32_t* group_item, const int64_t* n_pending,
                          const int64_t* first_row, float* pooled) {
  DSV41RT_CHECK(groups >= 0 && ratio >= 1 && D > 0, "compress_pool_gather: bad sizes");
  std::vector<float> v(ratio * D), s(ratio * D);
  for (int64_t g = 0; g < groups; ++g) {
    const int32_t b = group_item[g];
    if (b < 0) continue;
    const int64_t np = n_pending[g];
    const float* pv = reinterpret_cast<const float*>(slots[b] + pending_offset);
    const float* ps = pv + (ratio - 1) * D;
    std::copy(pv, pv + np * D, v.begin());
    std::copy(ps, ps + np * D, s.begin());
    std::copy(values + first_row[g] * D, values + (first_row[g] + ratio - np) * D,
              v.begin() + np * D);
    std::copy(scores + first_row[g] * D, scores + (first_row[g] + ratio - np) * D,
              s.begin() + np * D);
    compress_pool(v.data(), s.data(), 1, ratio, D, pooled + g * D);
  }
}

void store_pending(const float* values, const float* scores, uint8_t* const* slots,
                   int64_t pending_offset, int64_t ratio, int64_t D, int64_t n, const int32_t* item,
                   const int64_t* src_row, const int64_t* dst_row) {
  DSV41RT_CHECK(n >= 0 && ratio >= 2 && D > 0, "store_pending: bad sizes");
  for (int64_t r = 0; r < n; ++r) {
    if (item[r] < 0) continue;
    float* pv = reinterpret_cast<float*>(slots[item[r]] + pending_offset);
    std::copy(values + src_row[r] * D, values + (src_row[r] + 1) * D, pv + dst_row[r] * D);
    std::copy(scores + src_row[r] * D, scores + (src_row[r] + 1) * D,
              pv + (ratio - 1 + dst_row[r]) * D);
  }
}

void attention_indices(int64_t S, int64_t W, int64_t KI, const int32_t* row_item,
                       const int64_t* positions, const int64_t* window_first, const int64_t* length,
                       const int64_t* old_offset, const int64_t* row0, int64_t new_offset,
                       const int32_t* topk, const int64_t* comp_offset, int64_t comp_base,
                       int32_t* idx) {
  DSV41RT_CHECK(S >= 0 && W >= 1 && KI >= 0 && (KI == 0 || (topk && comp_offset)),
                "attention_indices: bad sizes or missing top-k");
  const int64_t K = W + KI;
  for (int64_t s = 0; s < S; ++s) {
    int32_t* out = idx + s * K;
    std::fill(out, out + K, -1);
    const int32_t b = row_item[s];
    if (b < 0) continue;
    const int64_t t = positions[s], lo = std::max<int64_t>(0, t - W + 1);
    for (int64_t p = lo; p <= t; ++p) {
      out[p - lo] = p < length[b] ? int32_t(old_offset[b] + p - window_first[b])
                                  : int32_t(new_offset + row0[b] + p - length[b]);
    }
    for (int64_t j = 0; j < KI; ++j) {
      const int32_t e = topk[s * KI + j];
      if (e >= 0) out[W + j] = int32_t(comp_base + comp_offset[b] + e);
    }
  }
}

void embed_rows(const float* table_f32, const uint16_t* table_bf16, const int32_t* tokens,
                int64_t n, int64_t H, int64_t copies, float* X) {
  DSV41RT_CHECK(H > 0 && copies >= 1 && (table_f32 || table_bf16), "embed_rows: bad arguments");
  for (int64_t t = 0; t < n; ++t) {
    float* first = X + t * copies * H;
    if (table_f32) {
      std::memcpy(first, table_f32 + int64_t(tokens[t]) * H, size_t(H) * sizeof(float));
    } else {
      dequant_bf16(table_bf16 + int64_t(tokens[t]) * H, H, first);
    }
    for (int64_t i = 1; i < copies; ++i) std::memcpy(first + i * H, first, size_t(H) * 4);
  }
}

void engram_gather(const uint8_t* table, const uint8_t* scales, const int64_t* rows, int64_t n,
                   int64_t hd, float* out) {
  DSV41RT_CHECK(hd > 0 && hd % 32 == 0, "engram_gather: head dim ", hd, " not a multiple of 32");
  for (int64_t i = 0; i < n; ++i) {
    dequant_fp8_blocks(table + rows[i] * hd, scales + rows[i] * (hd / 32), 1, hd, 1, 32,
                       out + i * hd);
  }
}

void gather_rows(const float* src, const int64_t* rows, int64_t n, int64_t dim, float* dst) {
  DSV41RT_CHECK(n >= 0 && dim > 0, "gather_rows: bad sizes n=", n, " dim=", dim);
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(dst + i * dim, src + rows[i] * dim, size_t(dim) * sizeof(float));
  }
}

void scale_inplace(float* x, int64_t n, float factor) {
  DSV41RT_CHECK(n >= 0, "scale_inplace: n=", n);
  for (int64_t i = 0; i < n; ++i) x[i] *= factor;
}

}  // namespace cpu
}  // namespace dsv41rt::kernels
