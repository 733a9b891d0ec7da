// Contract: manifold-constrained hyper-connections (mHC), V4.1 single-pass form (architecture spec
// §2.2; NeMo `deepseek_v41/layers.py` `DeepseekV41HyperConnection` and
// `deepseek_v4/optimized_kernels.py` `sinkhorn_normalize_torch`). All FP32, row-major.
//
// n = hc_mult streams, H = hidden, W = (2 + n)·n mixer outputs.
//
// hc_mix: X [S, n, H], fn [W, n·H], base [W], scale [3] ->
//          pre [S, n], post [S, n], comb [S, n, n] (comb[s, i, o]: row = input stream i,
//          column = output stream o).
//   f = X[s] flattened (n·H);  r = 1 / sqrt((Σ f²) / (n·H) + rms_eps)
//   mix = linear(f, fn) · r                        (projection BEFORE the RMS scale, as NeMo)
//   z_j = base_j + mix_j · scale_{g(j)}           (g = 0 for j < n, 1 for j < 2n, else 2)
//   pre = sigmoid(z[0:n]) + hc_eps;  post = 2 · sigmoid(z[n:2n]);  sigmoid(v) = 1 / (1 + exp(−v))
//   comb = Sinkhorn(z[2n:] viewed [n, n]) with T = iters (>= 1):
//     C = softmax over o (last dim) + hc_eps
//     C = C / (column sums over i + hc_eps)
//     T − 1 times:  C = C / (row sums over o + hc_eps);  C = C / (column sums + hc_eps)
//
// hc_head_pre (V4's hyper-head, transformers `DeepseekV4HyperHead`, spec §2.2): the final
//   collapse weights from fn [n, n·H], base [n], scale [1]: exactly hc_mix's pre with W = n,
//   pre = sigmoid(base + (linear(f, fn) · r) · scale) + hc_eps; the model then collapses with
//   hc_collapse and applies the final norm. (transformers normalises f before the projection;
//   the order differs in rounding only.)
//
// hc_collapse: X [S, n, H], w [S, n] -> u [S, H]:  u = Σ_i w_i · X_i  (FP32, i ascending).
// hc_expand:   X [S, n, H], y [S, H], post [S, n], comb [S, n, n] -> out [S, n, H]:
//   out_o = post_o · y + Σ_i comb[i, o] · X_i   (comb used transposed; i ascending).
// Outputs must not alias inputs.
#pragma once

#include <cstdint>

#include "core/export.h"

namespace dsv41rt::kernels::cpu {

/// The mixer (see above). Throws dsv41rt::Error on null pointers, S < 0, n <= 0, H <= 0, iters < 1.
DSV41RT_API void hc_mix(const float* X, const float* fn, const float* base, const float* scale,
                        int64_t S, int64_t n, int64_t H, float rms_eps, float hc_eps, int iters,
                        float* pre, float* post, float* comb);

/// The hyper-head's collapse weights pre [S, n] (see above). Throws like hc_mix.
DSV41RT_API void hc_head_pre(const float* X, const float* fn, const float* base, const float* scale,
                             int64_t S, int64_t n, int64_t H, float rms_eps, float hc_eps,
                             float* pre);

/// Sinkhorn normalisation of `count` n×n logit matrices in place (the comb part of hc_mix).
DSV41RT_API void hc_sinkhorn(float* logits, int64_t count, int64_t n, float hc_eps, int iters);

/// u[S, H] = Σ_i w[s, i] · X[s, i, :].
DSV41RT_API void hc_collapse(const float* X, const float* w, int64_t S, int64_t n, int64_t H,
                             float* u);

/// out[s, o, :] = post[s, o] · y[s, :] + Σ_i comb[s, i, o] · X[s, i, :].
DSV41RT_API void hc_expand(const float* X, const float* y, const float* post, const float* comb,
                           int64_t S, int64_t n, int64_t H, float* out);

}  // namespace dsv41rt::kernels::cpu
