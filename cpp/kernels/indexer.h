// Contract: V4.1 lightning indexer scoring, candidate blocks and top-k selection
// (architecture spec §2.7.2). All FP32; queries and keys arrive already MXFP4-QDQ'd.
//
// Visibility: query s may use compressed entry j iff j < n_visible[s] (= floor((pos+1)/m)).
#pragma once

#include <cstdint>

#include "core/export.h"

namespace dsv41rt::kernels::cpu {

/// scores[s, j] = Σ_h w[s,h] · relu(q[s,h,:] · keys[j,:]) for visible j, −inf otherwise.
///   q [S, H_I, D_I], keys [T, D_I], w [S, H_I] (already scaled by D_I^-½·H_I^-½),
///   n_visible [S], scores [S, T].
DSV41RT_API void indexer_scores(const float* q, const float* keys, const float* w,
                                const int64_t* n_visible, int64_t S, int64_t H, int64_t D,
                                int64_t T, float* scores);

/// The same with each query's keys starting at row key_offset[s] of `keys` (nullptr = 0): one
/// call scores a batch whose requests have different key sets.
DSV41RT_API void indexer_scores_offset(const float* q, const float* keys, const int64_t* key_offset,
                                       const float* w, const int64_t* n_visible, int64_t S,
                                       int64_t H, int64_t D, int64_t T, float* scores);

/// Candidate-source blocks: entries grouped in blocks of `block_size`; block score = max entry
/// score; the block holding the newest visible entry ((n_visible−1) div block_size) is forced in;
/// keep the top min(topk_blocks, n_blocks) blocks whose score is > −inf. mask [S, T] is 1 for
/// every visible entry of a kept block.
DSV41RT_API void candidate_blocks(const float* scores, const int64_t* n_visible, int64_t S,
                                  int64_t T, int64_t topk_blocks, int64_t block_size,
                                  uint8_t* mask);

/// scores[s, j] = −inf where mask[s, j] == 0 (later index sources restricted to candidates).
DSV41RT_API void apply_candidate_mask(float* scores, const uint8_t* mask, int64_t S, int64_t T);

/// Top-k selection per query: of the min(k, T) highest-scoring entries, the finite ones, sorted by
/// entry index ascending, then −1 padding to width k (scores are finite or −inf in the model; a
/// +inf would take a top-k place without being emitted). Ties go to the lower entry index (the
/// reference uses torch.topk, whose tie order is unspecified; exact ties are measure-zero for real
/// scores).
DSV41RT_API void topk_select(const float* scores, int64_t S, int64_t T, int64_t k,
                             int32_t* indices);

/// V4 HCA layers attend every visible compressed entry (no indexer; spec §2.6.3): the selection
/// list in topk_select's form, indices[s, j] = j for j < min(n_visible[s], k), then −1 to width k
/// (k = the most entries any query sees). Throws Error on k < 0, a null pointer, or a negative
/// n_visible (naming the row).
DSV41RT_API void visible_entries(const int64_t* n_visible, int64_t S, int64_t k, int32_t* indices);

}  // namespace dsv41rt::kernels::cpu
