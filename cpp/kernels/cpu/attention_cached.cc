#include "kernels/attention_cached.h"

#include <vector>

#include "core/status.h"
#include "kernels/attention.h"

namespace dsv41rt::kernels::cpu {
namespace {

// The stored row key index j of a query of item b points at (nullptr: a row of new_rows, which is
// FP32 already, returned through `fp32`). Throws when j is outside the item's rows.
const uint8_t* locate(const CachedKeys& k, int64_t b, int64_t j, int64_t D, const float** fp32,
                      RowFormat* format) {
  *fp32 = nullptr;
  if (j < k.old_rows) {
    const int64_t r = j - k.old_offset[b];
    DSV41RT_CHECK(r >= 0 && r < k.old_count[b], "sparse_attention_cached: window index ", j,
                  " is not one of item ", b, "'s ", k.old_count[b], " ring rows");
    *format = k.window_format;
    const int64_t position = k.window_first[b] + r;
    return k.ring.slots[b] + k.ring.offset + (position % k.ring.ring) * k.ring.row_bytes;
  }
  const int64_t comp_base = k.old_rows + k.new_count;
  if (j < comp_base) {
    *fp32 = k.new_rows + (j - k.old_rows) * D;
    return nullptr;
  }
  const int64_t e = j - comp_base - k.comp_offset[b];
  DSV41RT_CHECK(j - comp_base < k.comp_rows && e >= 0 && e < k.comp_count[b],
                "sparse_attention_cached: compressed index ", j, " is not one of item ", b, "'s ",
                k.comp_count[b], " entries");
  *format = k.comp_format;
  const PagedRows& p = k.comp;
  const int32_t page = p.page_table[b * p.max_pages + e / p.per_page];
  return p.pool + int64_t(page) * p.page_bytes + p.offset + (e % p.per_page) * p.row_bytes;
}

}  // namespace

// Reference: each query's keys decoded into a list of its own (rows in slot order), then
// sparse_attention over that list — the same rows in the same order as sparse_attention_split
// over the unpacked arrays, hence the same bits.
void sparse_attention_cached(const float* q, const CachedKeys& keys, const int32_t* indices,
                             const float* sink, int64_t S, int64_t n_heads, int64_t D, int64_t K,
                             float scale, float* out) {
  DSV41RT_CHECK(S >= 0 && n_heads > 0 && D > 0 && K >= 0,
                "sparse_attention_cached: bad sizes S=", S, " heads=", n_heads, " D=", D, " K=", K);
  const int64_t T = keys.old_rows + keys.new_count + keys.comp_rows;
  std::vector<float> rows(size_t(K * D));
  std::vector<int32_t> local(static_cast<size_t>(K));
  for (int64_t s = 0; s < S; ++s) {
    const int64_t b = keys.query_item[s];
    for (int64_t k = 0; k < K; ++k) {
      const int32_t j = indices[s * K + k];
      DSV41RT_CHECK(j >= -1 && j < T, "sparse_attention_cached: query ", s, " index ", j,
                    " outside [-1, ", T, ")");
      local[size_t(k)] = -1;
      if (j < 0 || b < 0) continue;
      const float* fp32 = nullptr;
      RowFormat format = RowFormat::kF32;
      const uint8_t* stored = locate(keys, b, j, D, &fp32, &format);
      float* dst = rows.data() + k * D;
      if (stored) {
        decode_row(format, stored, D, dst);
      } else {
        for (int64_t d = 0; d < D; ++d) dst[d] = fp32[d];
      }
      local[size_t(k)] = int32_t(k);
    }
    sparse_attention(q + s * n_heads * D, rows.data(), local.data(), sink, 1, n_heads, D, K, K,
                     scale, out + s * n_heads * D);
  }
}

}  // namespace dsv41rt::kernels::cpu
