// Contract: lightning-indexer scores (kernels/indexer.h indexer_scores_offset) whose keys are read
// from the token pages where they are stored, instead of from an FP32 copy unpacked first
// (kernels/paged.h unpack_paged). A decode step then reads each visible index key in its stored
// format once (68-byte MXFP4 rows at index_head_dim 128, against 512 FP32 bytes written and read
// again) and never writes the ratio's FP32 key array.
//
// Query s of item b = query_item[s] scores entry j (j < n_visible[s], clamped to [0, T]) of item
// b's index keys: the row at rows.pool + rows.page_table[b * rows.max_pages + j / rows.per_page] *
// rows.page_bytes + rows.offset + (j % rows.per_page) * rows.row_bytes, decoded with the codecs
// (kernels/quant.h, paged.h decode_row). Entries j >= n_visible[s] score -inf; b < 0 (a padding
// query) scores -inf everywhere. The result is bitwise indexer_scores_offset over unpack_paged's
// array (the CPU reference computes exactly that); the caller guarantees that every visible entry
// of item b is stored (n_visible[s] <= the item's entry count).
#pragma once

#include <cstdint>

#include "core/export.h"
#include "kernels/paged.h"

namespace dsv41rt::kernels {

struct IndexKeys {
  RowFormat format = RowFormat::kF32;
  PagedRows rows;
  const int32_t* query_item = nullptr;  ///< [S]
};

}  // namespace dsv41rt::kernels

namespace dsv41rt::kernels::cpu {

/// scores [S, T] as indexer_scores_offset over the keys `keys` locates (see above); q [S, H, D],
/// w [S, H] (already scaled), n_visible [S].
DSV41RT_API void indexer_scores_cached(const float* q, const IndexKeys& keys, const float* w,
                                       const int64_t* n_visible, int64_t S, int64_t H, int64_t D,
                                       int64_t T, float* scores);

}  // namespace dsv41rt::kernels::cpu
