// Contract: the gather/scatter ops between a forward's FP32 activations and the paged state
// (layout: runtime/model/state_layout.h), and the small index/gather ops of the batched forward.
//
// Every op reads its per-item and per-row metadata (lengths, positions, page tables, slot
// pointers) from arrays, never from scalar arguments beyond launch sizes, so a captured CUDA graph
// replays correctly after the host rewrites the metadata (plan/run split). Entries whose item is
// < 0 are padding: skipped on writes, their outputs left untouched (or -1 for index outputs).
// Row formats encode and decode bit for bit as the cache codecs of kernels/quant.h; kF32 is the
// cache_quant = false store (raw FP32 rows). kV4Row is DeepSeek-V4's 584-byte window / compressed
// row (quant.h v4_row_*; head_dim 512 only).
//
// CPU reference: kernels/cpu/paged.cc (host pointers); CUDA: kernels/cuda/paged.cuh (device
// pointers, the same semantics bit for bit — except compress_pool_gather, whose device expf differs
// from the host exp by up to 2 ulp: within 1e-5 relative).
#pragma once

#include <cstdint>

#include "core/export.h"

namespace dsv41rt::kernels {

enum class RowFormat : int { kF32 = 0, kFp8Window = 1, kNvfp4 = 2, kMxfp4 = 3, kV4Row = 4 };

/// Bytes of one stored row of `dim` channels (kV4Row: dim must be 512, else an Error naming it).
DSV41RT_API int64_t row_bytes(RowFormat f, int64_t dim);

/// Entries of one kind (compressed KV or index keys) of one KV source in the token pages: entry
/// e of item b is at pool + page_table[b * max_pages + e / per_page] * page_bytes + offset +
/// (e % per_page) * row_bytes.
struct PagedRows {
  uint8_t* pool = nullptr;
  int64_t page_bytes = 0;
  const int32_t* page_table = nullptr;  // [items, max_pages]
  int64_t max_pages = 0;
  int64_t per_page = 0;
  int64_t offset = 0;
  int64_t row_bytes = 0;
};

/// One layer's window ring: position p of item b is at slots[b] + offset + (p % ring) * row_bytes.
struct RingRows {
  uint8_t* const* slots = nullptr;  // [items]
  int64_t offset = 0;
  int64_t ring = 0;
  int64_t row_bytes = 0;
};

}  // namespace dsv41rt::kernels

namespace dsv41rt::kernels::cpu {

/// One stored row of `dim` channels decoded to FP32 (the codecs of kernels/quant.h).
DSV41RT_API void decode_row(RowFormat f, const uint8_t* row, int64_t dim, float* out);

/// out[out_offset[b] + j] = entry j of item b, for j < count[b] (<= max_count) and b < items.
DSV41RT_API void unpack_paged(RowFormat f, const PagedRows& src, int64_t dim, int64_t items,
                              int64_t max_count, const int64_t* count, const int64_t* out_offset,
                              float* out);

/// rows [n, dim] -> entry entry[i] of item item[i] (item < 0: skipped).
DSV41RT_API void pack_paged(RowFormat f, const PagedRows& dst, int64_t dim, int64_t n,
                            const float* rows, const int32_t* item, const int64_t* entry);

/// out[out_offset[b] + j] = ring row of position first[b] + j of item b, for j < count[b].
DSV41RT_API void unpack_ring(RowFormat f, const RingRows& src, int64_t dim, int64_t items,
                             int64_t max_count, const int64_t* first, const int64_t* count,
                             const int64_t* out_offset, float* out);

/// rows [n, dim] -> ring row of position positions[i] of item item[i] when item[i] >= 0 and
/// store[i] != 0.
DSV41RT_API void pack_ring(RowFormat f, const RingRows& dst, int64_t dim, int64_t n,
                           const float* rows, const int32_t* item, const int64_t* positions,
                           const uint8_t* store);

/// Compressor pooling over groups whose rows are an item's pending tokens (in its slot) followed
/// by new rows of the batch. Group g (item b = group_item[g]; < 0 skipped): row t < n_pending[g]
/// is pending row t (values at slots[b] + pending_offset + t·D floats, scores (ratio-1)·D floats
/// after the values), row t >= n_pending[g] is row first_row[g] + t - n_pending[g] of
/// values/scores [*, D]. pooled[g] = Σ_t softmax_t(score) · value per channel, in the exact
/// operation order of compress_pool (kernels/compressor.h).
DSV41RT_API void compress_pool_gather(const float* values, const float* scores,
                                      uint8_t* const* slots, int64_t pending_offset, int64_t groups,
                                      int64_t ratio, int64_t D, const int32_t* group_item,
                                      const int64_t* n_pending, const int64_t* first_row,
                                      float* pooled);

/// Copies values/scores row src_row[i] to pending row dst_row[i] of item item[i] (< 0 skipped).
DSV41RT_API void store_pending(const float* values, const float* scores, uint8_t* const* slots,
                               int64_t pending_offset, int64_t ratio, int64_t D, int64_t n,
                               const int32_t* item, const int64_t* src_row, const int64_t* dst_row);

/// Attention key lists, idx [S, W + KI] into the concatenation [window rows | compressed rows]:
/// query s (item b = row_item[s] (< 0: all -1), position t = positions[s]) gets, in slots
/// 0..t-lo (lo = max(0, t - W + 1)), the window positions lo..t: position p < length[b] is
/// window row old_offset[b] + p - window_first[b] (unpacked from the ring), otherwise row
/// new_offset + row0[b] + p - length[b] (this forward's rows); then -1 up to W. Slot W + j holds
/// comp_base + comp_offset[b] + topk[s, j] (topk -1 stays -1; topk == nullptr: KI must be 0).
DSV41RT_API void attention_indices(int64_t S, int64_t W, int64_t KI, const int32_t* row_item,
                                   const int64_t* positions, const int64_t* window_first,
                                   const int64_t* length, const int64_t* old_offset,
                                   const int64_t* row0, int64_t new_offset, const int32_t* topk,
                                   const int64_t* comp_offset, int64_t comp_base, int32_t* idx);

/// X [n, copies, H]: every copy of row t is embedding row tokens[t] (table_f32 [V, H], or
/// table_bf16 when table_f32 == nullptr; ids are checked by the caller).
DSV41RT_API void embed_rows(const float* table_f32, const uint16_t* table_bf16,
                            const int32_t* tokens, int64_t n, int64_t H, int64_t copies, float* X);

/// out [n, hd] = FP8 E4M3 table row rows[i] times its UE8M0 scales [*, hd / 32] (hd % 32 == 0).
DSV41RT_API void engram_gather(const uint8_t* table, const uint8_t* scales, const int64_t* rows,
                               int64_t n, int64_t hd, float* out);

/// dst[i] = src[rows[i]] for i < n (rows of dim floats).
DSV41RT_API void gather_rows(const float* src, const int64_t* rows, int64_t n, int64_t dim,
                             float* dst);

/// x[i] *= factor (one FP32 product each).
DSV41RT_API void scale_inplace(float* x, int64_t n, float factor);

}  // namespace dsv41rt::kernels::cpu
