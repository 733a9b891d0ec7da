#include "kernels/indexer_cached.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/status.h"
#include "kernels/indexer.h"

namespace dsv41rt::kernels::cpu {

// Reference: each query's visible keys decoded into a list of their own, then
// indexer_scores_offset for that query alone — the same values in the same arithmetic as over the
// unpacked array, hence the same bits.
void indexer_scores_cached(const float* q, const IndexKeys& keys, const float* w,
                           const int64_t* n_visible, int64_t S, int64_t H, int64_t D, int64_t T,
                           float* scores) {
  DSV41RT_CHECK(S >= 0 && H > 0 && D > 0 && T >= 0, "indexer_scores_cached: bad sizes S=", S,
                " H=", H, " D=", D, " T=", T);
  const PagedRows& p = keys.rows;
  std::vector<float> rows;
  for (int64_t s = 0; s < S; ++s) {
    const int64_t b = keys.query_item[s];
    const int64_t vis = b < 0 ? 0 : std::min<int64_t>(std::max<int64_t>(n_visible[s], 0), T);
    DSV41RT_CHECK(vis <= p.max_pages * p.per_page, "indexer_scores_cached: query ", s, " sees ",
                  vis, " entries, more than item ", b, "'s page table holds");
    rows.resize(size_t(std::max<int64_t>(vis, 1) * D));
    for (int64_t j = 0; j < vis; ++j) {
      const int32_t page = p.page_table[b * p.max_pages + j / p.per_page];
      const uint8_t* row =
          p.pool + int64_t(page) * p.page_bytes + p.offset + (j % p.per_page) * p.row_bytes;
      decode_row(keys.format, row, D, rows.data() + j * D);
    }
    indexer_scores_offset(q + s * H * D, rows.data(), nullptr, w + s * H, &vis, 1, H, D, T,
                          scores + s * T);
  }
}

}  // namespace dsv41rt::kernels::cpu
