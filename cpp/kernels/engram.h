// Contract: Engram (V4.1, spec §4.1) n-gram hash rows and the gated residual update, FP32.
// Reference: NeMo Automodel 0.7.0 models/deepseek_v41/engram.py (`DeepseekV41NgramHash.forward`,
// `DeepseekV41Engram.forward`).
#pragma once

#include <cstdint>

#include "core/export.h"

namespace dsv41rt::kernels::cpu {

/// Hash rows of ONE Engram layer for S positions.
///   compressed_ids [S + max_ngram - 1]: the max_ngram - 1 history slots first (oldest first), then
///     the S new positions. A negative id marks a position that blocks lookback: before the start
///     of the sequence, or a dead (image / masked / other-document) position. When the lookback of
///     shift s (s = 0 .. max_ngram-1) reaches a blocking position, that shift and all larger shifts
///     use pad_id (NeMo: `blocked` accumulates over shifts; the current token itself may block).
///   multipliers [max_ngram]; primes, offsets [(max_ngram - 1) * n_heads], order
///     [n=2 h0..h(n_heads-1), n=3 ..., ...] (python/dsv41rt/config/engram_layout.py).
///   rows [S, (max_ngram - 1) * n_heads] (int64): with v_s = c_s · mult[s] (int64, wrapping),
///     r_1 = v_0 ^ v_1, r_s = r_{s-1} ^ v_s, row(n = s+1, h) = floor_mod(r_s, P[s-1][h]) + off[...]
///     (floor_mod = Python / torch `%`: result in [0, P) also for negative r_s).
/// primes must be > 0; pad_id >= 0.
DSV41RT_API void engram_hash_rows(const int64_t* compressed_ids, int64_t S, int64_t max_ngram,
                                  int64_t n_heads, const int64_t* multipliers,
                                  const int64_t* primes, const int64_t* offsets, int64_t pad_id,
                                  int64_t* rows);

/// Engram residual update (spec §4.1.4), in place on X [S, n, H] (n = hc_mult streams):
///   kv = emb · wkv^T, emb [S, D] (the gathered, dequantised rows, D = hash_heads · head_dim),
///   wkv [(n + 1) · H, D]; key = kv[:, :n·H] as [n, H], value = kv[:, n·H:] [H].
///   For each stream i: w = q_weight[i] · k_weight[i] ([n, H] each),
///     rstd = rsqrt(mean(X_i²) + eps) · rsqrt(mean(key_i²) + eps),
///     dot  = (Σ_c X_i,c · w_c · key_i,c) · rstd · H^-0.5,
///     gate = sigmoid(copysign(sqrt(max(|dot|, 1e-6)), dot)), 0 where token_mask[t] == 0,
///     X_i += gate · value   (all from the ORIGINAL X; FP32 throughout as NeMo in FP32).
/// token_mask [S] may be nullptr (all live).
DSV41RT_API void engram_forward(float* X, const float* emb, const float* wkv, const float* q_weight,
                                const float* k_weight, const uint8_t* token_mask, int64_t S,
                                int64_t n, int64_t H, int64_t D, float eps);

}  // namespace dsv41rt::kernels::cpu
