// Contract: RMSNorm on FP32 rows (architecture spec §2.1; NeMo `DeepseekV41RMSNorm`).
//
//   x [rows, dim] row-major, weight [dim] (or nullptr = no weight), y [rows, dim] row-major.
//   y = weight ⊙ (x · rsqrt(mean(x²) + eps)), in NeMo's order of operations:
//     ms = (Σ x²) / dim;  r = 1 / sqrt(ms + eps);  v = x · r;  y = weight · v.
//   The sum of squares is accumulated in double and rounded once to FP32 (torch uses a cascade
//   FP32 sum; both are within a few ulp of the exact value). y may alias x (in place).
//   V4.1 uses eps = 1e-20 (rms_norm_eps), V4 uses 1e-6.
#pragma once

#include <cstdint>

#include "core/export.h"

namespace dsv41rt::kernels::cpu {

/// y = weight ⊙ x · rsqrt(mean(x²) + eps) per row; weight == nullptr means no weight.
/// Throws dsv41rt::Error on null x/y, rows < 0, dim <= 0 or eps < 0.
DSV41RT_API void rms_norm(const float* x, const float* weight, int64_t rows, int64_t dim, float eps,
                          float* y);

/// Unweighted RMS normalisation: y = x · rsqrt(mean(x²) + eps).
inline void rms_normalize(const float* x, int64_t rows, int64_t dim, float eps, float* y) {
  rms_norm(x, nullptr, rows, dim, eps, y);
}

/// r = 1 / sqrt((Σ x²) / dim + eps) for one row of length dim (the scalar RMSNorm multiplies by).
DSV41RT_API float rms_inv(const float* x, int64_t dim, float eps);

}  // namespace dsv41rt::kernels::cpu
