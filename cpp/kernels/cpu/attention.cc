#include "kernels/attention.h"

#include <cmath>
#include <limits>
#include <vector>

#include "core/status.h"

namespace dsv41rt::kernels::cpu {
namespace {

// `row(j)` is the key/value row of index j (0 <= j < T).
template <class Row>
void attend(const float* q, Row row_of, const int32_t* indices, const float* sink, int64_t S,
            int64_t n_heads, int64_t D, int64_t T, int64_t K, float scale, float* out) {
  DSV41RT_CHECK(S >= 0 && n_heads > 0 && D > 0 && T >= 0 && K >= 0,
                "sparse_attention: bad sizes S=", S, " heads=", n_heads, " D=", D, " T=", T,
                " K=", K);
  for (int64_t s = 0; s < S; ++s) {
    for (int64_t k = 0; k < K; ++k) {
      const int32_t j = indices[s * K + k];
      DSV41RT_CHECK(j >= -1 && j < T, "sparse_attention: query ", s, " index ", j, " outside [-1, ",
                    T, ")");
    }
  }
#pragma omp parallel
  {
    std::vector<float> logits(K);
#pragma omp for collapse(2) schedule(static)
    for (int64_t s = 0; s < S; ++s) {
      for (int64_t h = 0; h < n_heads; ++h) {
        const float* qh = q + (s * n_heads + h) * D;
        const int32_t* idx = indices + s * K;
        float* oh = out + (s * n_heads + h) * D;
        float m = sink[h];
        for (int64_t k = 0; k < K; ++k) {
          if (idx[k] < 0) continue;
          const float* row = row_of(idx[k]);
          float acc = 0;
          for (int64_t d = 0; d < D; ++d) acc += qh[d] * row[d];
          logits[k] = acc * scale;
          m = std::max(m, logits[k]);
        }
        float denom = std::exp(sink[h] - m);
        for (int64_t d = 0; d < D; ++d) oh[d] = 0;
        for (int64_t k = 0; k < K; ++k) {
          if (idx[k] < 0) continue;
          const float p = std::exp(logits[k] - m);
          denom += p;
          const float* row = row_of(idx[k]);
          for (int64_t d = 0; d < D; ++d) oh[d] += p * row[d];
        }
        const float inv = 1.0f / denom;
        for (int64_t d = 0; d < D; ++d) oh[d] *= inv;
      }
    }
  }
}

}  // namespace

void sparse_attention(const float* q, const float* kv, const int32_t* indices, const float* sink,
                      int64_t S, int64_t n_heads, int64_t D, int64_t T, int64_t K, float scale,
                      float* out) {
  attend(
      q, [&](int32_t j) { return kv + int64_t(j) * D; }, indices, sink, S, n_heads, D, T, K, scale,
      out);
}

void sparse_attention_split(const float* q, const float* kv_a, int64_t T_a, const float* kv_b,
                            int64_t T_b, const int32_t* indices, const float* sink, int64_t S,
                            int64_t n_heads, int64_t D, int64_t K, float scale, float* out) {
  attend(
      q, [&](int32_t j) { return j < T_a ? kv_a + int64_t(j) * D : kv_b + (int64_t(j) - T_a) * D; },
      indices, sink, S, n_heads, D, T_a + T_b, K, scale, out);
}

}  // namespace dsv41rt::kernels::cpu
