// Contract: sparse attention with sink (kernels/attention.h) whose keys are read from the caches
// where they are stored, instead of from FP32 copies unpacked first (kernels/paged.h
// unpack_ring / unpack_paged). A decode step then reads each selected row in its stored format
// once (528-byte FP8 window rows, 288-byte NVFP4 compressed rows at head_dim 512) and never
// writes the ratio's whole FP32 dequant workspace.
//
// The key indices are exactly attention_indices' (kernels/paged.h), so the same index array serves
// both ways. For query s of item b = query_item[s] (b < 0: a padding query, every index skipped):
//   j < old_rows                      window ring row of position window_first[b] + j -
//                                     old_offset[b] (valid: 0 <= j - old_offset[b] < old_count[b])
//   old_rows <= j < comp_base         row j - old_rows of new_rows (this forward's window rows,
//                                     FP32, after the cache QDQ), comp_base = old_rows + new_count
//   comp_base <= j < comp_base + comp_rows
//                                     compressed entry e = j - comp_base - comp_offset[b] of item b
//                                     in `comp` (valid: 0 <= e < comp_count[b])
// -1 is skipped. Row decode is the codecs' (kernels/quant.h), so the result is bitwise
// sparse_attention_split over the unpacked arrays (the CPU reference computes exactly that).
#pragma once

#include <cstdint>

#include "core/export.h"
#include "kernels/paged.h"

namespace dsv41rt::kernels {

struct CachedKeys {
  // Window rows older than this forward, in their layer's ring.
  RowFormat window_format = RowFormat::kF32;
  RingRows ring;
  const int64_t* window_first = nullptr;  ///< [items]
  const int64_t* old_offset = nullptr;    ///< [items]
  const int64_t* old_count = nullptr;     ///< [items]
  int64_t old_rows = 0;
  // This forward's window rows [new_count, D].
  const float* new_rows = nullptr;
  int64_t new_count = 0;
  // The KV source's compressed entries in the token pages.
  RowFormat comp_format = RowFormat::kF32;
  PagedRows comp;
  const int64_t* comp_offset = nullptr;  ///< [items]
  const int64_t* comp_count = nullptr;   ///< [items]
  int64_t comp_rows = 0;
  const int32_t* query_item = nullptr;  ///< [S]
};

}  // namespace dsv41rt::kernels

namespace dsv41rt::kernels::cpu {

/// out [S, n_heads, D] as sparse_attention over the keys `keys` locates (see above). Throws on an
/// index that points outside its item's rows (the CUDA kernel skips it like -1).
DSV41RT_API void sparse_attention_cached(const float* q, const CachedKeys& keys,
                                         const int32_t* indices, const float* sink, int64_t S,
                                         int64_t n_heads, int64_t D, int64_t K, float scale,
                                         float* out);

}  // namespace dsv41rt::kernels::cpu
