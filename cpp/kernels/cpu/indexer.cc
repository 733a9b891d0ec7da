#include "kernels/indexer.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/status.h"

namespace dsv41rt::kernels::cpu {

void indexer_scores(const float* q, const float* keys, const float* w, const int64_t* n_visible,
                    int64_t S, int64_t H, int64_t D, int64_t T, float* scores) {
  indexer_scores_offset(q, keys, nullptr, w, n_visible, S, H, D, T, scores);
}

void indexer_scores_offset(const float* q, const float* keys, const int64_t* key_offset,
                           const float* w, const int64_t* n_visible, int64_t S, int64_t H,
                           int64_t D, int64_t T, float* scores) {
  DSV41RT_CHECK(S >= 0 && H > 0 && D > 0 && T >= 0, "indexer_scores: bad sizes");
#pragma omp parallel for schedule(static)
  for (int64_t s = 0; s < S; ++s) {
    const int64_t vis = std::min<int64_t>(std::max<int64_t>(n_visible[s], 0), T);
    for (int64_t j = 0; j < T; ++j) {
      if (j >= vis) {
        scores[s * T + j] = -INFINITY;
        continue;
      }
      float total = 0;
      for (int64_t h = 0; h < H; ++h) {
        const float* qh = q + (s * H + h) * D;
        const float* kj = keys + ((key_offset ? key_offset[s] : 0) + j) * D;
        float dot = 0;
        for (int64_t d = 0; d < D; ++d) dot += qh[d] * kj[d];
        total += std::max(dot, 0.0f) * w[s * H + h];
      }
      scores[s * T + j] = total;
    }
  }
}

void candidate_blocks(const float* scores, const int64_t* n_visible, int64_t S, int64_t T,
                      int64_t topk_blocks, int64_t block_size, uint8_t* mask) {
  DSV41RT_CHECK(block_size > 0 && topk_blocks > 0, "candidate_blocks: block_size and topk_blocks ",
                "must be positive");
  const int64_t n_blocks = (T + block_size - 1) / block_size;
  std::vector<float> block(n_blocks);
  std::vector<int64_t> order(n_blocks);
  for (int64_t s = 0; s < S; ++s) {
    const float* row = scores + s * T;
    for (int64_t b = 0; b < n_blocks; ++b) {
      float m = -INFINITY;
      for (int64_t j = b * block_size; j < std::min(T, (b + 1) * block_size); ++j) {
        m = std::max(m, row[j]);
      }
      block[b] = m;
    }
    const int64_t vis = std::min(n_visible[s], T);
    if (vis > 0) block[(vis - 1) / block_size] = INFINITY;  // the newest block is always kept
    std::iota(order.begin(), order.end(), 0);
    const int64_t keep = std::min(topk_blocks, n_blocks);
    std::partial_sort(order.begin(), order.begin() + keep, order.end(), [&](int64_t a, int64_t b) {
      return block[a] > block[b] || (block[a] == block[b] && a < b);
    });
    uint8_t* out = mask + s * T;
    std::fill(out, out + T, uint8_t{0});
    for (int64_t i = 0; i < keep; ++i) {
      const int64_t b = order[i];
      if (!(block[b] > -INFINITY)) continue;
      for (int64_t j = b * block_size; j < std::min(T, (b + 1) * block_size); ++j) {
        out[j] = j < vis ? 1 : 0;
      }
    }
  }
}

void apply_candidate_mask(float* scores, const uint8_t* mask, int64_t S, int64_t T) {
  DSV41RT_CHECK(S >= 0 && T >= 0, "apply_candidate_mask: bad sizes S=", S, " T=", T);
  for (int64_t i = 0; i < S * T; ++i) {
    if (!mask[i]) scores[i] = -INFINITY;
  }
}

void visible_entries(const int64_t* n_visible, int64_t S, int64_t k, int32_t* indices) {
  DSV41RT_CHECK(k >= 0 && S >= 0, "visible_entries: bad sizes S=", S, " k=", k);
  if (S == 0 || k == 0) return;
  DSV41RT_CHECK(n_visible && indices, "visible_entries: null pointer");
  for (int64_t s = 0; s < S; ++s) {
    DSV41RT_CHECK(n_visible[s] >= 0, "visible_entries: row ", s, " sees ", n_visible[s],
                  " entries");
    const int64_t n = std::min(n_visible[s], k);
    for (int64_t j = 0; j < k; ++j) indices[s * k + j] = j < n ? int32_t(j) : -1;
  }
}

void topk_select(const float* scores, int64_t S, int64_t T, int64_t k, int32_t* indices) {
  DSV41RT_CHECK(k >= 0 && T >= 0, "topk_select: bad sizes");
  std::vector<int32_t> order(T);
  for (int64_t s = 0; s < S; ++s) {
    const float* row = scores + s * T;
    std::iota(order.begin(), order.end(), 0);
    const int64_t take = std::min(k, T);
    std::partial_sort(order.begin(), order.begin() + take, order.end(), [&](int32_t a, int32_t b) {
      return row[a] > row[b] || (row[a] == row[b] && a < b);
    });
    int32_t* out = indices + s * k;
    int64_t n = 0;
    for (int64_t i = 0; i < take; ++i) {
      if (std::isfinite(row[order[i]])) out[n++] = order[i];
    }
    std::sort(out, out + n);
    for (int64_t i = n; i < k; ++i) out[i] = -1;
  }
}

}  // namespace dsv41rt::kernels::cpu
