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

/// Keys per block of the blocked variant below (the official kernel's `block`).
inline constexpr int64_t kSparseAttentionBf16Block = 64;

/// The official `sparse_attn` kernel's numerics, proposed for precision fp8
/// (docs/design/fp8-attention-numerics.md; not wired to any precision yet). Same arguments as
/// sparse_attention_split. Per query s and head h, with the key list taken in blocks of
/// kSparseAttentionBf16Block entries in list order (m = -inf, l = 0, o = 0 before the first):
///   s_j = fp32(q_bf16 · k_j) * scale        q rounded to BF16 (RNE); the dot in FP64, rounded once
///   m' = max(m, max_j s_j),  r = exp(m - m')                         (r exact; 0 while m = -inf)
///   p_j = fp32(exp(s_j - m'))                                        (the FP32 difference)
///   l = l * r + sum_j p_j,   o = o * r + sum_j bf16(p_j) * k_j,   m = m'
/// then l += exp(sink_h - m) and out = bf16(o / l). l, o and r in FP64: a kernel's FP32 sums and
/// rescales differ from this by their order and rounding only. The row sum uses the unrounded p,
/// P·V the BF16 one, as the kernel does. A block without a valid index changes nothing (the
/// kernel would turn a leading one into NaN); a query without any gets a zero output.
DSV41RT_API void sparse_attention_bf16_blocks(const float* q, const float* kv_a, int64_t T_a,
                                              const float* kv_b, int64_t T_b,
                                              const int32_t* indices, const float* sink, int64_t S,
                                              int64_t n_heads, int64_t D, int64_t K, float scale,
                                              float* out);

}  // namespace dsv41rt::kernels::cpu
