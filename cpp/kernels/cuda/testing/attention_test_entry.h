// Host-pointer entry points of the CUDA attention-side kernels (sparse attention, compressor
// pooling, indexer scores, candidate blocks, top-k selection), for the device-parameterised op
// tests (tests/python/test_cuda_ops_attention.py through dsv41rt._core.cuda_ops). Plain C++: no
// CUDA types. Each copies inputs to the device, poisons the output, runs on the default stream,
// synchronises and copies back; CUDA errors (including invalid sizes) throw dsv41rt::Error.
// sparse_attention does not validate indices on the host: out-of-range ones are skipped by the
// kernel like -1 (the tests exercise that path).
#pragma once

#include <cstdint>

#include "core/export.h"

namespace dsv41rt::kernels::cuda::testing {

DSV41RT_API void sparse_attention(const float* q, const float* kv, const int32_t* indices,
                                  const float* sink, int64_t S, int64_t n_heads, int64_t D,
                                  int64_t T, int64_t K, float scale, float* out);

DSV41RT_API void compress_pool(const float* values, const float* scores, int64_t groups,
                               int64_t ratio, int64_t D, float* pooled);

DSV41RT_API void indexer_scores(const float* q, const float* keys, const float* w,
                                const int64_t* n_visible, int64_t S, int64_t H, int64_t D,
                                int64_t T, float* scores);

DSV41RT_API void candidate_blocks(const float* scores, const int64_t* n_visible, int64_t S,
                                  int64_t T, int64_t topk_blocks, int64_t block_size,
                                  uint8_t* mask);

DSV41RT_API void topk_select(const float* scores, int64_t S, int64_t T, int64_t k,
                             int32_t* indices);

}  // namespace dsv41rt::kernels::cuda::testing
