// CUDA gather/scatter between the executor's FP32 activations and the paged state (layout:
// runtime/model/state_layout.h), plus the small index/gather kernels of the GPU forward.
//
// Every kernel reads its per-item and per-row metadata (lengths, positions, page tables, slot
// pointers) from device arrays, never from launch arguments, so a captured CUDA graph replays
// correctly after the host rewrites the metadata buffers (plan/run split). Entries whose item is
// < 0 are padding: skipped on writes, their outputs left untouched. Row formats decode and encode
// bit for bit like the CPU codecs (kernels/cpu/quant.cc); kF32 is the cache_quant = false store.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/export.h"

namespace dsv41rt::kernels::cuda {

enum class RowFormat : int { kF32 = 0, kFp8Window = 1, kNvfp4 = 2, kMxfp4 = 3 };

/// Entries of one kind (compressed KV or index keys) of one KV source in the token pages: entry
/// e of item b is at pool + page_table[b * max_pages + e / per_page] * page_bytes + offset +
/// (e % per_page) * row_bytes.
struct PagedRows {
  uint8_t* pool = nullptr;
  int64_t page_bytes = 0;
  const int32_t* page_table = nullptr;  // device [items, max_pages]
  int64_t max_pages = 0;
  int64_t per_page = 0;
  int64_t offset = 0;
  int64_t row_bytes = 0;
};

/// One layer's window ring: position p of item b is at slots[b] + offset + (p % ring) * row_bytes.
struct RingRows {
  uint8_t* const* slots = nullptr;  // device [items]
  int64_t offset = 0;
  int64_t ring = 0;
  int64_t row_bytes = 0;
};

/// out[out_offset[b] + j] = entry j of item b, for j < count[b] (<= max_count) and b < items.
DSV41RT_API cudaError_t unpack_paged(RowFormat f, const PagedRows& src, int64_t dim, int64_t items,
                                     int64_t max_count, const int64_t* count,
                                     const int64_t* out_offset, float* out, cudaStream_t stream);

/// rows [n, dim] -> entry entry[i] of item item[i] (item < 0: skipped).
DSV41RT_API cudaError_t pack_paged(RowFormat f, const PagedRows& dst, int64_t dim, int64_t n,
                                   const float* rows, const int32_t* item, const int64_t* entry,
                                   cudaStream_t stream);

/// out[out_offset[b] + j] = ring row of position first[b] + j of item b, for j < count[b].
DSV41RT_API cudaError_t unpack_ring(RowFormat f, const RingRows& src, int64_t dim, int64_t items,
                                    int64_t max_count, const int64_t* first, const int64_t* count,
                                    const int64_t* out_offset, float* out, cudaStream_t stream);

/// rows [n, dim] -> ring row of position positions[i] of item item[i] when item[i] >= 0 and
/// store[i] != 0.
DSV41RT_API cudaError_t pack_ring(RowFormat f, const RingRows& dst, int64_t dim, int64_t n,
                                  const float* rows, const int32_t* item, const int64_t* positions,
                                  const uint8_t* store, cudaStream_t stream);

/// Compressor pooling over groups whose rows are an item's pending tokens (in its slot) followed
/// by new rows of the batch. Group g (item b = group_item[g]; < 0 skipped): row t < n_pending[g]
/// is pending row t (values at slots[b] + pending_offset + t·D floats, scores (ratio-1)·D floats
/// after the values), row t >= n_pending[g] is row first_row[g] + t - n_pending[g] of
/// values/scores [*, D]. pooled[g] = Σ_t softmax_t(score) · value per channel, in the CPU
/// reference's exact operation order (kernels/cpu/compressor.cc).
DSV41RT_API cudaError_t compress_pool_gather(const float* values, const float* scores,
                                             uint8_t* const* slots, int64_t pending_offset,
                                             int64_t groups, int64_t ratio, int64_t D,
                                             const int32_t* group_item, const int64_t* n_pending,
                                             const int64_t* first_row, float* pooled,
                                             cudaStream_t stream);

/// Copies values/scores row src_row[i] to pending row dst_row[i] of item item[i] (< 0 skipped).
DSV41RT_API cudaError_t store_pending(const float* values, const float* scores,
                                      uint8_t* const* slots, int64_t pending_offset, int64_t ratio,
                                      int64_t D, int64_t n, const int32_t* item,
                                      const int64_t* src_row, const int64_t* dst_row,
                                      cudaStream_t stream);

/// Attention key lists, idx [S, W + KI] into the concatenation [window rows | compressed rows]:
/// query s (item b = row_item[s] (< 0: all -1), position t = positions[s]) gets, in slots
/// 0..t-lo (lo = max(0, t - W + 1)), the window positions lo..t: position p < length[b] is
/// window row old_offset[b] + p - window_first[b] (unpacked from the ring), otherwise row
/// new_offset + row0[b] + p - length[b] (this forward's rows); then -1 up to W. Slot W + j holds
/// comp_base + comp_offset[b] + topk[s, j] (topk -1 stays -1; topk == nullptr: KI must be 0).
DSV41RT_API cudaError_t attention_indices(int64_t S, int64_t W, int64_t KI, const int32_t* row_item,
                                          const int64_t* positions, const int64_t* window_first,
                                          const int64_t* length, const int64_t* old_offset,
                                          const int64_t* row0, int64_t new_offset,
                                          const int32_t* topk, const int64_t* comp_offset,
                                          int64_t comp_base, int32_t* idx, cudaStream_t stream);

/// X [n, copies, H]: every copy of row t is embedding row tokens[t] (table_f32 [V, H], or
/// table_bf16 when table_f32 == nullptr; ids are checked by the host).
DSV41RT_API cudaError_t embed_rows(const float* table_f32, const uint16_t* table_bf16,
                                   const int32_t* tokens, int64_t n, int64_t H, int64_t copies,
                                   float* X, cudaStream_t stream);

/// out [n, hd] = FP8 E4M3 table row rows[i] times its UE8M0 scales [*, hd / 32] (hd % 32 == 0).
DSV41RT_API cudaError_t engram_gather(const uint8_t* table, const uint8_t* scales,
                                      const int64_t* rows, int64_t n, int64_t hd, float* out,
                                      cudaStream_t stream);

/// scores[i] = -inf where mask[i] == 0 (n elements).
DSV41RT_API cudaError_t apply_candidate_mask(float* scores, const uint8_t* mask, int64_t n,
                                             cudaStream_t stream);

/// dst[i] = src[rows[i]] for i < n (rows of dim floats).
DSV41RT_API cudaError_t gather_rows(const float* src, const int64_t* rows, int64_t n, int64_t dim,
                                    float* dst, cudaStream_t stream);

/// x[i] *= factor (FP32 product, as the CPU loop).
DSV41RT_API cudaError_t scale_inplace(float* x, int64_t n, float factor, cudaStream_t stream);

}  // namespace dsv41rt::kernels::cuda
