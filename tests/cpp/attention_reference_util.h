// Sparse attention with sink in float64 (contract: kernels/attention.h) and the rounding bound of
// an FP32 evaluation against it, shared by test_backend_attention.cc and
// test_backend_attention_cached.cc.
//
// The bound (per output channel d of a query row s, head h):
//   Δ = γ(u, n_dot) · scale · max_j Σ_c |q_c v_jc| + u · max_j |l_j|     (error of any logit l_j)
//   |o_d − ref_d| <= (3Δ + 3γ(u, n_sum)) · Σ_j p_j |v_jd| / (Σ_j p_j + p_sink)
// The logit error enters every weight twice (numerator and denominator); the factor 3 also holds
// the exp and division roundings, and the K-term weighted sums add γ(u, n_sum) (Higham Thm 3.1:
// a sum in ANY order of n terms errs by at most γ_{n} Σ |terms|). u and the term counts describe
// the evaluation: `fp32_rounding` the CPU reference (round to nearest), `cuda_rounding`
// the CUDA backend's kernels.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "backend_test_util.h"

namespace dsv41rt::testing {

/// Float64 attention outputs and the per-element / per-row magnitudes the bound scales with.
struct AttentionF64 {
  std::vector<double> out;           ///< [S, H, D]
  std::vector<double> weighted_abs;  ///< [S, H, D]: Σ_j p_j |v_jd| / (Σ_j p_j + p_sink)
  std::vector<double> logit_abs;     ///< [S, H]: max_j scale · Σ_c |q_c v_jc|
  std::vector<double> logit_max;     ///< [S, H]: max_j |l_j|
};

/// Query s, head h attends to the rows idx[s, :] (-1 skipped) of kv_a [T_a, D] ++ kv_b.
inline AttentionF64 attention_f64(const std::vector<float>& q, const std::vector<float>& kv_a,
                                  int64_t T_a, const std::vector<float>& kv_b,
                                  const std::vector<int32_t>& idx, const std::vector<float>& sink,
                                  int64_t S, int64_t H, int64_t D, int64_t K, float scale) {
  AttentionF64 r;
  r.out.assign(size_t(S * H * D), 0.0);
  r.weighted_abs.assign(size_t(S * H * D), 0.0);
  r.logit_abs.assign(size_t(S * H), 0.0);
  r.logit_max.assign(size_t(S * H), 0.0);
  auto row = [&](int32_t j) {
    return j < T_a ? &kv_a[size_t(j * D)] : &kv_b[size_t((j - T_a) * D)];
  };
  std::vector<double> logit(static_cast<size_t>(K)), acc(static_cast<size_t>(D)),
      abs_acc(static_cast<size_t>(D));
  for (int64_t s = 0; s < S; ++s) {
    for (int64_t h = 0; h < H; ++h) {
      const float* qh = &q[size_t((s * H + h) * D)];
      const size_t sh = size_t(s * H + h);
      double m = sink[size_t(h)];
      bool any = false;
      for (int64_t j = 0; j < K; ++j) {
        const int32_t at = idx[size_t(s * K + j)];
        if (at < 0) continue;
        const float* v = row(at);
        double dot = 0, abs_dot = 0;
        for (int64_t c = 0; c < D; ++c) {
          dot += double(qh[c]) * v[c];
          abs_dot += std::abs(double(qh[c]) * v[c]);
        }
        logit[size_t(j)] = dot * scale;
        r.logit_abs[sh] = std::max(r.logit_abs[sh], abs_dot * scale);
        r.logit_max[sh] = std::max(r.logit_max[sh], std::abs(logit[size_t(j)]));
        m = std::max(m, logit[size_t(j)]);
        any = true;
      }
      if (!any) continue;  // no key: a zero output (the contract)
      double denom = std::exp(double(sink[size_t(h)]) - m);
      std::fill(acc.begin(), acc.end(), 0.0);
      std::fill(abs_acc.begin(), abs_acc.end(), 0.0);
      for (int64_t j = 0; j < K; ++j) {
        const int32_t at = idx[size_t(s * K + j)];
        if (at < 0) continue;
        const float* v = row(at);
        const double p = std::exp(logit[size_t(j)] - m);
        denom += p;
        for (int64_t c = 0; c < D; ++c) {
          acc[size_t(c)] += p * v[c];
          abs_acc[size_t(c)] += p * std::abs(double(v[c]));
        }
      }
      for (int64_t c = 0; c < D; ++c) {
        r.out[sh * size_t(D) + size_t(c)] = acc[size_t(c)] / denom;
        r.weighted_abs[sh * size_t(D) + size_t(c)] = abs_acc[size_t(c)] / denom;
      }
    }
  }
  return r;
}

/// How an FP32 evaluation rounds: unit roundoff per operation and the most rounded terms in a
/// logit's dot product and in a channel's weighted sum.
struct AttentionRounding {
  double u;
  int64_t n_dot, n_sum;
};

/// The CPU reference: IEEE round to nearest; D products and the scale; K terms, the sink, the
/// division.
inline AttentionRounding fp32_rounding(int64_t D, int64_t K) { return {kU, D + 1, K + 4}; }

/// The CUDA backend's kernels (kernels/cuda/attention.cu on FP32 keys, attention_tc.cu and
/// attention_prefill_tc.cu on BF16-valued keys), covered by one bound: FP32 operands (queries,
/// probabilities) split into three BF16 parts whose products with the BF16 keys are exact,
/// accumulated by mma.sync in FP32 with truncation (up to one ulp, 2u, per rounded addition; a
/// k16 step adds 16 aligned products to the accumulator); at most 8 partial logits and the scale;
/// per key chunk (32 or 64 keys) an online rescale (expf, a product, a sum); the cluster combine
/// of 4 key slices, expf's 2 ulp, the division. The FP32 kernel rounds to nearest in fewer terms.
inline AttentionRounding cuda_rounding(int64_t D, int64_t K) {
  const int64_t chunks = (K + 31) / 32;
  return {2 * kU, 3 * D + 3 * D / 16 + 9, 3 * K + 3 * K / 16 + 3 * chunks + 16};
}

/// The per-element bound of the header comment.
inline std::vector<double> attention_bound(const AttentionF64& ref, int64_t D,
                                           const AttentionRounding& r) {
  auto gamma = [&](int64_t n) { return double(n) * r.u / (1.0 - double(n) * r.u); };
  std::vector<double> tol(ref.out.size());
  for (size_t sh = 0; sh < ref.logit_abs.size(); ++sh) {
    const double delta = gamma(r.n_dot) * ref.logit_abs[sh] + r.u * ref.logit_max[sh];
    for (int64_t c = 0; c < D; ++c) {
      const size_t i = sh * size_t(D) + size_t(c);
      tol[i] = (3 * delta + 3 * gamma(r.n_sum)) * ref.weighted_abs[i];
    }
  }
  return tol;
}

}  // namespace dsv41rt::testing
