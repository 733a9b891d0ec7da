// CUDA implementation of the paged gather/scatter ops (contract and semantics: kernels/paged.h;
// CPU reference: kernels/cpu/paged.cc). All pointers, metadata arrays included, are device
// pointers; results are bitwise equal to the CPU reference, except compress_pool_gather (device
// expf: within 1e-5 relative).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/export.h"
#include "kernels/paged.h"

namespace dsv41rt::kernels::cuda {

using kernels::PagedRows;
using kernels::RingRows;
using kernels::RowFormat;

DSV41RT_API cudaError_t unpack_paged(RowFormat f, const PagedRows& src, int64_t dim, int64_t items,
                                     int64_t max_count, const int64_t* count,
                                     const int64_t* out_offset, float* out, cudaStream_t stream);

DSV41RT_API cudaError_t pack_paged(RowFormat f, const PagedRows& dst, int64_t dim, int64_t n,
                                   const float* rows, const int32_t* item, const int64_t* entry,
                                   cudaStream_t stream);

DSV41RT_API cudaError_t unpack_ring(RowFormat f, const RingRows& src, int64_t dim, int64_t items,
                                    int64_t max_count, const int64_t* first, const int64_t* count,
                                    const int64_t* out_offset, float* out, cudaStream_t stream);

DSV41RT_API cudaError_t pack_ring(RowFormat f, const RingRows& dst, int64_t dim, int64_t n,
                                  const float* rows, const int32_t* item, const int64_t* positions,
                                  const uint8_t* store, cudaStream_t stream);

DSV41RT_API cudaError_t compress_pool_gather(const float* values, const float* scores,
                                             uint8_t* const* slots, int64_t pending_offset,
                                             int64_t groups, int64_t ratio, int64_t D,
                                             const int32_t* group_item, const int64_t* n_pending,
                                             const int64_t* first_row, float* pooled,
                                             cudaStream_t stream);

DSV41RT_API cudaError_t store_pending(const float* values, const float* scores,
                                      uint8_t* const* slots, int64_t pending_offset, int64_t ratio,
                                      int64_t D, int64_t n, const int32_t* item,
                                      const int64_t* src_row, const int64_t* dst_row,
                                      cudaStream_t stream);

DSV41RT_API cudaError_t attention_indices(int64_t S, int64_t W, int64_t KI, const int32_t* row_item,
                                          const int64_t* positions, const int64_t* window_first,
                                          const int64_t* length, const int64_t* old_offset,
                                          const int64_t* row0, int64_t new_offset,
                                          const int32_t* topk, const int64_t* comp_offset,
                                          int64_t comp_base, int32_t* idx, cudaStream_t stream);

DSV41RT_API cudaError_t embed_rows(const float* table_f32, const uint16_t* table_bf16,
                                   const int32_t* tokens, int64_t n, int64_t H, int64_t copies,
                                   float* X, cudaStream_t stream);

DSV41RT_API cudaError_t engram_gather(const uint8_t* table, const uint8_t* scales,
                                      const int64_t* rows, int64_t n, int64_t hd, float* out,
                                      cudaStream_t stream);

DSV41RT_API cudaError_t apply_candidate_mask(float* scores, const uint8_t* mask, int64_t n,
                                             cudaStream_t stream);

DSV41RT_API cudaError_t gather_rows(const float* src, const int64_t* rows, int64_t n, int64_t dim,
                                    float* dst, cudaStream_t stream);

DSV41RT_API cudaError_t scale_inplace(float* x, int64_t n, float factor, cudaStream_t stream);

}  // namespace dsv41rt::kernels::cuda
