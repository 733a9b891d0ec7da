// The numpy wrappers of the attention-side op family (sparse attention with sink, compressor
// pooling, indexer scores, candidate blocks, top-k), shared by dsv41rt._core.ops (CPU references)
// and dsv41rt._core.cuda_ops (CUDA kernels through host-pointer test entries): one set of shape
// checks, the implementation passed as function pointers with the signatures of the CPU contracts
// (kernels/attention.h, compressor.h, indexer.h).
#pragma once

#include <nanobind/nanobind.h>

#include <cstdint>

namespace dsv41rt::bindings {

struct AttentionFns {
  using SparseAttention = void (*)(const float*, const float*, const int32_t*, const float*,
                                   int64_t, int64_t, int64_t, int64_t, int64_t, float, float*);
  using CompressPool = void (*)(const float*, const float*, int64_t, int64_t, int64_t, float*);
  using IndexerScores = void (*)(const float*, const float*, const float*, const int64_t*, int64_t,
                                 int64_t, int64_t, int64_t, float*);
  using CandidateBlocks = void (*)(const float*, const int64_t*, int64_t, int64_t, int64_t, int64_t,
                                   uint8_t*);
  using TopkSelect = void (*)(const float*, int64_t, int64_t, int64_t, int32_t*);
  SparseAttention sparse_attention;
  CompressPool compress_pool;
  IndexerScores indexer_scores;
  CandidateBlocks candidate_blocks;
  TopkSelect topk_select;
};

/// Defines sparse_attention, compress_pool, indexer_scores, candidate_blocks and topk_select on
/// `ops` with the implementations in `fns`.
void register_attention_family(nanobind::module_& ops, const AttentionFns& fns);

}  // namespace dsv41rt::bindings
