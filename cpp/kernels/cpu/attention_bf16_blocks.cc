// The official sparse_attn kernel's numerics on the CPU (contract: kernels/attention.h
// sparse_attention_bf16_blocks; why: docs/design/fp8-attention-numerics.md).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "kernels/attention.h"

namespace dsv41rt::kernels::cpu {
namespace {

float bf16(float v) { return bf16_to_f32(f32_to_bf16(v)); }

// One query and head: q_bf16 [D], the list idx [K] of rows of `row_of`.
template <class Row>
void attend_one(const float* q_bf16, Row row_of, const int32_t* idx, float sink, int64_t D,
                int64_t K, float scale, std::vector<double>& o, std::vector<float>& s_blk,
                float* out) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  double m = -kInf, l = 0;
  std::fill(o.begin(), o.end(), 0.0);
  for (int64_t b0 = 0; b0 < K; b0 += kSparseAttentionBf16Block) {
    const int64_t b1 = std::min(K, b0 + kSparseAttentionBf16Block);
    double m_new = m;
    bool any = false;
    for (int64_t k = b0; k < b1; ++k) {
      if (idx[k] < 0) continue;
      const float* row = row_of(idx[k]);
      double dot = 0;  // BF16 x FP32 products are exact in FP64; FP64 sum, rounded to FP32 once
      for (int64_t d = 0; d < D; ++d) dot += double(q_bf16[d]) * double(row[d]);
      s_blk[k - b0] = float(dot) * scale;
      m_new = std::max(m_new, double(s_blk[k - b0]));
      any = true;
    }
    if (!any) continue;
    const double r = m == -kInf ? 0.0 : std::exp(m - m_new);
    l *= r;
    for (double& v : o) v *= r;
    for (int64_t k = b0; k < b1; ++k) {
      if (idx[k] < 0) continue;
      const float p = float(std::exp(double(s_blk[k - b0] - float(m_new))));
      const double pb = bf16(p);
      l += p;
      const float* row = row_of(idx[k]);
      for (int64_t d = 0; d < D; ++d) o[size_t(d)] += pb * double(row[d]);
    }
    m = m_new;
  }
  if (m == -kInf) {  // no valid key
    std::fill(out, out + D, 0.0f);
    return;
  }
  l += std::exp(double(sink) - m);
  for (int64_t d = 0; d < D; ++d) out[d] = bf16(float(o[size_t(d)] / l));
}

}  // namespace

void sparse_attention_bf16_blocks(const float* q, const float* kv_a, int64_t T_a, const float* kv_b,
                                  int64_t T_b, const int32_t* indices, const float* sink, int64_t S,
                                  int64_t n_heads, int64_t D, int64_t K, float scale, float* out) {
  DSV41RT_CHECK(S >= 0 && n_heads > 0 && D > 0 && T_a >= 0 && T_b >= 0 && K >= 0,
                "sparse_attention_bf16_blocks: bad sizes S=", S, " heads=", n_heads, " D=", D,
                " T=", T_a + T_b, " K=", K);
  const int64_t T = T_a + T_b;
  for (int64_t i = 0; i < S * K; ++i) {
    DSV41RT_CHECK(indices[i] >= -1 && indices[i] < T, "sparse_attention_bf16_blocks: query ",
                  i / std::max<int64_t>(K, 1), " index ", indices[i], " outside [-1, ", T, ")");
  }
  auto row_of = [&](int32_t j) {
    return j < T_a ? kv_a + int64_t(j) * D : kv_b + (int64_t(j) - T_a) * D;
  };
#pragma omp parallel
  {
    std::vector<double> o(static_cast<size_t>(D));
    std::vector<float> q_bf16(static_cast<size_t>(D));
    std::vector<float> s_blk(static_cast<size_t>(kSparseAttentionBf16Block));
#pragma omp for collapse(2) schedule(static)
    for (int64_t s = 0; s < S; ++s) {
      for (int64_t h = 0; h < n_heads; ++h) {
        const float* qh = q + (s * n_heads + h) * D;
        for (int64_t d = 0; d < D; ++d) q_bf16[size_t(d)] = bf16(qh[d]);
        attend_one(q_bf16.data(), row_of, indices + s * K, sink[h], D, K, scale, o, s_blk,
                   out + (s * n_heads + h) * D);
      }
    }
  }
}

}  // namespace dsv41rt::kernels::cpu
