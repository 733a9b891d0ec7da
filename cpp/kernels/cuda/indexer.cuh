// CUDA lightning-indexer scoring, candidate blocks and top-k selection (contract:
// kernels/indexer.h), FP32. All pointers are device pointers; outputs never alias inputs.
// candidate_blocks and topk_select reproduce the CPU reference exactly on the same scores
// (ties to the lower index; -0.0 ranks equal to +0.0). NaN scores are unsupported (the CPU
// reference's ordering is undefined for them); here a NaN ranks above +inf and is never emitted.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/export.h"
#include "kernels/indexer_cached.h"

namespace dsv41rt::kernels::cuda {

/// The same with each query's keys starting at row key_offset[s] of `keys` (device int64 [S];
/// nullptr = 0): one launch scores a batch whose requests have different key sets.
DSV41RT_API cudaError_t indexer_scores_offset(const float* q, const float* keys,
                                              const int64_t* key_offset, const float* w,
                                              const int64_t* n_visible, int64_t S, int64_t H,
                                              int64_t D, int64_t T, float* scores,
                                              cudaStream_t stream);

/// The same on tensor cores (kernels/cuda/indexer_tc.cu) for queries and keys whose every element
/// is a BF16 value (the MXFP4 caches'; a value that is not is rounded to one: the caller's
/// precondition, not checked): exact products, FP32 sums per head in another order (mostly exact
/// for MXFP4 values), the head sum in the CPU's order. Requires indexer_scores_tc_supported
/// (cudaErrorInvalidValue otherwise).
DSV41RT_API cudaError_t indexer_scores_tc(const float* q, const float* keys,
                                          const int64_t* key_offset, const float* w,
                                          const int64_t* n_visible, int64_t S, int64_t H, int64_t D,
                                          int64_t T, float* scores, cudaStream_t stream);
/// The same with the keys read from the token pages as stored (kernels/indexer_cached.h; FP8
/// window, NVFP4 or MXFP4 rows, decoded exactly): bitwise indexer_scores_tc over unpack_paged's
/// array. cudaErrorInvalidValue for another format or unsupported sizes.
DSV41RT_API cudaError_t indexer_scores_tc_cached(const float* q, const IndexKeys& keys,
                                                 const float* w, const int64_t* n_visible,
                                                 int64_t S, int64_t H, int64_t D, int64_t T,
                                                 float* scores, cudaStream_t stream);
/// 1 <= H <= 64, D a multiple of 64 up to 256, q and keys 16-byte aligned.
DSV41RT_API bool indexer_scores_tc_supported(int64_t H, int64_t D, const float* q,
                                             const float* keys);

/// mask [S, T] (uint8): 1 for every visible entry of a kept block (block score = max entry
/// score; the newest visible block forced in; the top min(topk_blocks, n_blocks) blocks with
/// score > −inf kept, ties to the lower block index).
DSV41RT_API cudaError_t candidate_blocks(const float* scores, const int64_t* n_visible, int64_t S,
                                         int64_t T, int64_t topk_blocks, int64_t block_size,
                                         uint8_t* mask, cudaStream_t stream);

/// indices int32 [S, k]: the min(k, T) top entries (ties to the lower index), finite ones only,
/// ascending by index, then −1 padding. Any T and k (the row is streamed from global memory).
DSV41RT_API cudaError_t topk_select(const float* scores, int64_t S, int64_t T, int64_t k,
                                    int32_t* indices, cudaStream_t stream);

}  // namespace dsv41rt::kernels::cuda
