#include "kernels/engram.h"

#include <cmath>
#include <vector>

#include "core/status.h"
#include "kernels/linear.h"

namespace dsv41rt::kernels::cpu {

void engram_hash_rows(const int64_t* compressed_ids, int64_t S, int64_t max_ngram, int64_t n_heads,
                      const int64_t* multipliers, const int64_t* primes, const int64_t* offsets,
                      int64_t pad_id, int64_t* rows) {
  DSV41RT_CHECK(S >= 0 && max_ngram >= 2 && n_heads >= 1, "engram_hash_rows: S=", S,
                " max_ngram=", max_ngram, " n_heads=", n_heads);
  DSV41RT_CHECK(pad_id >= 0, "engram_hash_rows: pad_id=", pad_id);
  DSV41RT_CHECK(compressed_ids && multipliers && primes && offsets && rows,
                "engram_hash_rows: null pointer");
  const int64_t cols = (max_ngram - 1) * n_heads;
  for (int64_t c = 0; c < cols; ++c) {
    DSV41RT_CHECK(primes[c] > 0, "engram_hash_rows: primes[", c, "] = ", primes[c]);
  }
  const int64_t hist = max_ngram - 1;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < S; ++t) {
    int64_t* out = rows + t * cols;
    bool blocked = false;
    uint64_t rolling = 0;
    for (int64_t s = 0; s < max_ngram; ++s) {
      const int64_t src = compressed_ids[hist + t - s];
      blocked = blocked || src < 0;
      const int64_t tok = blocked ? pad_id : src;
      // int64 product with two's-complement wrap-around (torch / numpy semantics).
      const uint64_t v = static_cast<uint64_t>(tok) * static_cast<uint64_t>(multipliers[s]);
      rolling = s == 0 ? v : (rolling ^ v);
      if (s == 0) continue;
      const int64_t r = static_cast<int64_t>(rolling);
      for (int64_t h = 0; h < n_heads; ++h) {
        const int64_t c = (s - 1) * n_heads + h;
        int64_t m = r % primes[c];
        if (m < 0) m += primes[c];  // floor mod (Python / torch `%`)
        out[c] = m + offsets[c];
      }
    }
  }
}

void engram_forward(float* X, const float* emb, const float* wkv, const float* q_weight,
                    const float* k_weight, const uint8_t* token_mask, int64_t S, int64_t n,
                    int64_t H, int64_t D, float eps) {
  DSV41RT_CHECK(S >= 0 && n >= 1 && H > 0 && D > 0, "engram_forward: S=", S, " n=", n, " H=", H,
                " D=", D);
  if (S == 0) return;
  DSV41RT_CHECK(X && emb && wkv && q_weight && k_weight, "engram_forward: null pointer");
  const int64_t kvw = (n + 1) * H;
  std::vector<float> kv(S * kvw);
  linear(emb, wkv, S, D, kvw, kv.data());
  const float inv_sqrt_h = static_cast<float>(std::pow(static_cast<double>(H), -0.5));
  const float fH = static_cast<float>(H);
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < S; ++t) {
    const float* key = kv.data() + t * kvw;
    const float* value = key + n * H;
    const bool live = token_mask == nullptr || token_mask[t] != 0;
    for (int64_t i = 0; i < n; ++i) {
      float* xi = X + (t * n + i) * H;
      const float* ki = key + i * H;
      const float* qw = q_weight + i * H;
      const float* kw = k_weight + i * H;
      float gate = 0.0f;
      if (live) {
        double sx = 0, sk = 0, sd = 0;  // double accumulators: below FP32 rounding of the result
        for (int64_t c = 0; c < H; ++c) {
          const float w = qw[c] * kw[c];
          sx += double(xi[c]) * xi[c];
          sk += double(ki[c]) * ki[c];
          sd += double(xi[c] * w) * ki[c];
        }
        const float rstd = (1.0f / std::sqrt(static_cast<float>(sx) / fH + eps)) *
                           (1.0f / std::sqrt(static_cast<float>(sk) / fH + eps));
        const float dot = static_cast<float>(sd) * rstd * inv_sqrt_h;
        const float a = std::fabs(dot);
        const float mag = std::sqrt(a < 1e-6f ? 1e-6f : a);  // clamp_min, NaN propagates
        const float z = std::copysign(mag, dot);
        gate = 1.0f / (1.0f + std::exp(-z));
      }
      for (int64_t c = 0; c < H; ++c) xi[c] = xi[c] + gate * value[c];
    }
  }
}

}  // namespace dsv41rt::kernels::cpu
