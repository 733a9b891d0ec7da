#include "kernels/linear.h"

#include <algorithm>
#include <cstring>

#include "core/dtype.h"
#include "core/status.h"
#include "kernels/quant.h"

namespace dsv41rt::kernels::cpu {
namespace {

// Dot product with 8 independent partial sums: vectorises well and keeps the summation order
// fixed (independent of m, of threading and of where the row sits in a batch), which is what makes
// prefill and decode produce identical logits.
inline float dot(const float* a, const float* b, int64_t k) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) {
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  }
  float tail = 0;
  for (; i < k; ++i) tail += a[i] * b[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) + tail;
}

}  // namespace

void linear(const float* x, const float* w, int64_t m, int64_t k, int64_t n, float* y,
            bool accumulate) {
  DSV41RT_CHECK(m >= 0 && k >= 0 && n >= 0, "linear: bad sizes m=", m, " k=", k, " n=", n);
  // Tile over (rows of w) x (rows of x) so a block of weight rows stays in cache while every
  // activation row streams past it; the weight matrix is the large operand.
  constexpr int64_t kWTile = 64;
#pragma omp parallel for schedule(static)
  for (int64_t n0 = 0; n0 < n; n0 += kWTile) {
    const int64_t n1 = std::min(n, n0 + kWTile);
    for (int64_t r = 0; r < m; ++r) {
      const float* xr = x + r * k;
      float* yr = y + r * n;
      for (int64_t c = n0; c < n1; ++c) {
        const float v = dot(xr, w + c * k, k);
        yr[c] = accumulate ? yr[c] + v : v;
      }
    }
  }
}

void round_to_bf16(float* v, int64_t n) {
  for (int64_t i = 0; i < n; ++i) v[i] = bf16_to_f32(f32_to_bf16(v[i]));
}

void round_gemm_inputs(float* v, int64_t rows, int64_t k, GemmInputs inputs) {
  if (inputs == GemmInputs::kBf16) round_to_bf16(v, rows * k);
  if (inputs == GemmInputs::kFp8) fp8_act_qdq(v, rows, k, v);
}

void grouped_linear(const float* x, const float* w, int64_t m, int64_t groups, int64_t k_g,
                    int64_t n_g, float* y) {
  DSV41RT_CHECK(m >= 0 && groups >= 1 && k_g >= 0 && n_g >= 0, "grouped_linear: bad sizes m=", m,
                " groups=", groups, " k_g=", k_g, " n_g=", n_g);
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      const float* xr = x + (r * groups + g) * k_g;
      const float* wg = w + g * n_g * k_g;
      float* yr = y + (r * groups + g) * n_g;
      for (int64_t c = 0; c < n_g; ++c) yr[c] = dot(xr, wg + c * k_g, k_g);
    }
  }
}

}  // namespace dsv41rt::kernels::cpu
