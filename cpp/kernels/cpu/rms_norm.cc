#include "kernels/rms_norm.h"

#include <cmath>

#include "core/status.h"

namespace dsv41rt::kernels::cpu {

float rms_inv(const float* x, int64_t dim, float eps) {
  // Σ x² in double, rounded once: within a few ulp of torch's cascade FP32 sum and independent of
  // any vector width. Then exactly torch's FP32 steps: mean = sum / dim, rsqrt = 1 / sqrt(. + eps).
  double acc = 0;
  for (int64_t i = 0; i < dim; ++i) {
    const float sq = x[i] * x[i];  // torch squares in FP32 first
    acc += sq;
  }
  const float mean = static_cast<float>(acc) / static_cast<float>(dim);
  const float denom = mean + eps;
  return 1.0f / std::sqrt(denom);
}

void rms_norm(const float* x, const float* weight, int64_t rows, int64_t dim, float eps, float* y) {
  DSV41RT_CHECK(x != nullptr && y != nullptr, "rms_norm: null x or y");
  DSV41RT_CHECK(rows >= 0 && dim > 0, "rms_norm: bad shape rows=", rows, " dim=", dim);
  DSV41RT_CHECK(eps >= 0 && std::isfinite(eps), "rms_norm: bad eps ", eps);
#pragma omp parallel for schedule(static) if (rows * dim > (1 << 16))
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    const float inv = rms_inv(xr, dim, eps);
    if (weight != nullptr) {
      for (int64_t i = 0; i < dim; ++i) {
        const float v = xr[i] * inv;
        yr[i] = weight[i] * v;
      }
    } else {
      for (int64_t i = 0; i < dim; ++i) yr[i] = xr[i] * inv;
    }
  }
}

}  // namespace dsv41rt::kernels::cpu
