#include "kernels/compressor.h"

#include <cmath>

#include "core/status.h"

namespace dsv41rt::kernels::cpu {

void compress_pool(const float* values, const float* scores, int64_t groups, int64_t ratio,
                   int64_t D, float* pooled) {
  DSV41RT_CHECK(groups >= 0 && ratio >= 1 && D > 0, "compress_pool: bad sizes groups=", groups,
                " ratio=", ratio, " D=", D);
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t c = 0; c < D; ++c) {
      // Softmax as torch computes it: exp(x - max) / Σ exp(x - max), then Σ value · p.
      float m = -INFINITY;
      for (int64_t t = 0; t < ratio; ++t) m = std::fmax(m, scores[(g * ratio + t) * D + c]);
      float denom = 0;
      for (int64_t t = 0; t < ratio; ++t) denom += std::exp(scores[(g * ratio + t) * D + c] - m);
      float acc = 0;
      for (int64_t t = 0; t < ratio; ++t) {
        const int64_t i = (g * ratio + t) * D + c;
        acc += values[i] * (std::exp(scores[i] - m) / denom);
      }
      pooled[g * D + c] = acc;
    }
  }
}

}  // namespace dsv41rt::kernels::cpu
