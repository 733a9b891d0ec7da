// Contract: sparse attention with a per-head sink over an explicit key list per query
// (architecture spec §2.3 step 6, §2.8). Keys double as values (one shared KV latent).
//
//   q        [S, n_heads, D]   queries (RoPE applied, not quantised)
//   kv       [T, D]            key/value rows: window rows and selected compressed entries
//   indices  [S, K]            rows of kv each query attends to; -1 entries are skipped
//   sink     [n_heads]         per-head sink logit (an extra softmax term with a zero value)
//   out      [S, n_heads, D]
// o_h = Σ_j exp(s_j − M) kv_j / (Σ_j exp(s_j − M) + exp(sink_h − M)), s_j = scale · q_h·kv_j,
// M = max(max_j s_j, sink_h). A query with no valid key gets a zero output.
#pragma once

#include <cstdint>

#include "core/export.h"

namespace dsv41rt::kernels::cpu {

DSV41RT_API void sparse_attention(const float* q, const float* kv, const int32_t* indices,
                                  const float* sink, int64_t S, int64_t n_heads, int64_t D,
                                  int64_t T, int64_t K, float scale, float* out);

/// The same over two key arrays without copying them together: index j < T_a is row j of kv_a,
/// T_a <= j < T_a + T_b is row j - T_a of kv_b (a forward's window rows and the ratio's dequant
/// workspace). Bitwise equal to sparse_attention over the concatenation.
DSV41RT_API void sparse_attention_split(const float* q, const float* kv_a, int64_t T_a,
                                        const float* kv_b, int64_t T_b, const int32_t* indices,
                                        const float* sink, int64_t S, int64_t n_heads, int64_t D,
                                        int64_t K, float scale, float* out);

}  // namespace dsv41rt::kernels::cpu
