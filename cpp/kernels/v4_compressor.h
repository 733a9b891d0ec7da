// Contract: the DeepSeek-V4 compressors up to their RMSNorm (architecture spec §2.6.2-§2.6.4;
// reference: transformers 5.23 models/deepseek_v4/modeling_deepseek_v4.py `DeepseekV4CSACompressor`
// (lines 600-713), `DeepseekV4HCACompressor` (373-454) and the nested compressor of
// `DeepseekV4Indexer` (473-597), which repeats the CSA scheme at index_head_dim).
//
// All FP32, weights PyTorch [out, in]. One compressor has H (hidden), D (entry width), ratio m and
// whether its windows overlap (W = projection width: 2D with overlap, D without):
//   a_t = x_t · wkv^T, s_t = x_t · wgate^T + ape[t mod m]              (both [W])
//   HCA (m = 128, no overlap): entry j pools the m tokens of group j:
//     pooled[j, c] = Σ_{t in group j} softmax_t(s[t, c]) · a[t, c]
//   CSA / indexer (m = 4, overlap): entry j pools 2m slots per channel c < D, in this order:
//     slots 0..m-1  = the A-halves (a[t, c], s[t, c])         of group j-1 (t = m(j-1) .. mj-1)
//     slots m..2m-1 = the B-halves (a[t, D + c], s[t, D + c]) of group j   (t = mj .. mj+m-1)
//     and for j = 0 the A slots are masked (value 0, score -inf: softmax weight exactly 0).
//   entry[j] = norm_weight ⊙ pooled[j] · rsqrt(mean(pooled[j]²) + eps)   (kernels/rms_norm.h)
// Not in these ops (the caller's): the BF16 cast of `pooled` that the official reference does
// before the norm (spec §2.6.2; transformers in FP32 has none), RoPE at position m·j, the cache
// quantisation, and for the indexer keys the Walsh-Hadamard rotation (kernels/hadamard.h).
//
// Softmax and pooling per channel in slot order (max, then Σ exp(s - max), then Σ a · p as
// kernels/compressor.h's compress_pool does); masked slots are skipped, which equals adding their
// exact-zero terms. Prefill and decode call the same per-entry code on the same projected rows
// (`linear` rows do not depend on the batch), so the two forms agree bitwise.
#pragma once

#include <cstdint>
#include <vector>

#include "core/export.h"

namespace dsv41rt::kernels {

/// One V4 compressor's weights (borrowed FP32 pointers) and shape.
struct V4CompressorWeights {
  int64_t H = 0;               // hidden size (x width)
  int64_t D = 0;               // entry width (head_dim 512, or index_head_dim 128 for the indexer)
  int64_t ratio = 0;           // m: 4 (CSA, indexer) or 128 (HCA)
  bool overlap = false;        // true for CSA and the indexer compressor (ratio 4), false for HCA
  const float* wkv = nullptr;  // [W, H]
  const float* wgate = nullptr;        // [W, H]
  const float* ape = nullptr;          // [ratio, W] absolute position embedding of the scores
  const float* norm_weight = nullptr;  // [D]
  float eps = 1e-6f;                   // rms_norm_eps (V4: 1e-6)

  int64_t width() const { return overlap ? 2 * D : D; }
};

/// What decode keeps between steps so that feeding tokens in any chunks (one at a time included)
/// emits the same entries bitwise as v4_compress_prefill on the whole prompt:
///   - the projected rows (a, s with the APE already added) of the current partial group: the
///     softmax of an entry needs all of its group's scores, so they wait until the group is full;
///   - with overlap, the A-halves (a[:D], s[:D]) of the last complete group: entry j reads group
///     j-1's A-halves, and nothing else of an older group is ever read again (the B-halves are
///     folded into the entry already emitted). Before the first complete group there is none and
///     the A slots are masked, exactly as prefill's j = 0.
/// Rows are stored post-projection rather than as x: x is H wide (4096-7168) and re-projecting it
/// would only repeat the same dot products.
///
/// The state is flat FP32 at a fixed place (a request's slot in the paged pool, state_layout.h),
/// in this order: pending_a [ratio, W], pending_s [ratio, W], then with overlap prev_a [ratio, D],
/// prev_s [ratio, D]. Which rows are valid follows from `tokens` (the positions fed so far, i.e.
/// the request length): pending rows 0 .. tokens % ratio - 1, the prev rows iff tokens >= ratio.
/// Nothing else is stored, so the executor needs no per-compressor counters. Per request:
/// 2·m·W (+ 2·m·D) floats, i.e. V4-Flash CSA 2·4·1024 + 2·4·512 = 12288, its indexer
/// compressor 3072, HCA 2·128·512 = 131072 floats.
struct V4CompressorRows {
  float* pending_a = nullptr;
  float* pending_s = nullptr;
  float* prev_a = nullptr;  // null without overlap
  float* prev_s = nullptr;
};

/// Floats of one compressor's flat state (the order above).
DSV41RT_API int64_t v4_compressor_state_floats(const V4CompressorWeights& w);
/// The rows of a flat state of v4_compressor_state_floats(w) floats at `base`.
DSV41RT_API V4CompressorRows v4_compressor_rows(const V4CompressorWeights& w, float* base);

/// The flat state in its own memory with its token count (tests, single-sequence use).
struct DSV41RT_API V4CompressorState {
  V4CompressorState() = default;
  explicit V4CompressorState(const V4CompressorWeights& w);

  int64_t ratio = 0, W = 0, D = 0;
  bool overlap = false;
  int64_t tokens = 0;       // tokens fed so far (absolute position of the next one)
  std::vector<float> flat;  // v4_compressor_state_floats(w), zeroed
};

}  // namespace dsv41rt::kernels

namespace dsv41rt::kernels::cpu {

/// Prefill form: entries [floor(T / ratio), D] of a whole prompt x [T, H] starting at position 0
/// (the trailing partial group produces nothing). Throws Error on bad sizes / null pointers.
DSV41RT_API void v4_compress_prefill(const kernels::V4CompressorWeights& w, const float* x,
                                     int64_t T, float* entries);

/// Decode / chunked form on a flat state (V4CompressorRows; `tokens` = positions fed before x):
/// feeds x [n, H] (the next n positions) and writes the entries of the groups they complete to
/// `entries` ([floor((tokens % ratio + n) / ratio), D]); returns how many were written. The caller
/// advances its token count by n (the executor: the request length).
DSV41RT_API int64_t v4_compress_append_rows(const kernels::V4CompressorWeights& w,
                                            const kernels::V4CompressorRows& rows, int64_t tokens,
                                            const float* x, int64_t n, float* entries);

/// The same after the projections: a, s [n, W] are the n new rows' x · wkv^T and x · wgate^T
/// (the caller's `linear`, whose rows do not depend on the batch, so this is bitwise
/// v4_compress_append_rows); the APE is added here. w.wkv / w.wgate are not read.
DSV41RT_API int64_t v4_compress_projected(const kernels::V4CompressorWeights& w,
                                          const kernels::V4CompressorRows& rows, int64_t tokens,
                                          const float* a, const float* s, int64_t n,
                                          float* entries);

/// Batched over the requests of a forward, each state in its request slot (the Backend op
/// `v4_compress`): item b (items of them) continues the flat state at slots[b] + state_offset
/// bytes, which has seen length[b] tokens, with the projected rows row0[b] .. row0[b] + n[b] - 1
/// of a / s [*, W]; its floor((length[b] % ratio + n[b]) / ratio) new entries go to rows
/// entry0[b] .. of entries [*, D]. Items are independent (disjoint slots and rows).
DSV41RT_API void v4_compress_paged(const kernels::V4CompressorWeights& w, const float* a,
                                   const float* s, uint8_t* const* slots, int64_t state_offset,
                                   int64_t items, const int64_t* length, const int64_t* row0,
                                   const int64_t* n, const int64_t* entry0, float* entries);

/// The same on a V4CompressorState, whose token count it advances. The state must come from
/// V4CompressorState(w).
DSV41RT_API int64_t v4_compress_append(const kernels::V4CompressorWeights& w,
                                       kernels::V4CompressorState& state, const float* x, int64_t n,
                                       float* entries);

}  // namespace dsv41rt::kernels::cpu
