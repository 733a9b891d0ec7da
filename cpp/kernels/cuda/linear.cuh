// CUDA dense projections (contract: kernels/linear.h), FP32, device pointers, row-major.
//   linear:         y[m, n] (=|+=) x[m, k] · w[n, k]^T
//   grouped_linear: x [m, g, k_g], w [g, n_g, k_g] -> y [m, g, n_g] (group by group)
// A shared-memory tiled kernel (32x32 output tile, 32-wide k slices, FP32 FMA accumulation in
// k order within a thread): any m, n, k (edges masked; k = 0 gives zeros). The summation order
// differs from the CPU's 8-lane dot, so results agree to ~1e-6 relative, not bitwise. Like the
// CPU reference, each output is one k-ordered dot product: results do not depend on m. y must not
// alias x or w. Limits: ceil(m/32) <= 65535 and groups <= 65535 (cudaErrorInvalidValue beyond,
// and when w's shape does not cover the op).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/export.h"
#include "kernels/weight_view.h"

namespace dsv41rt::kernels::cuda {

/// w: the weight matrix as stored (kernels/weight_view.h), [n, k] (grouped: [groups * n_g, k_g],
/// group g reading rows [g * n_g, (g + 1) * n_g)). Every format decodes exactly to FP32 first, so
/// FP8 / MXFP4 / BF16 weights give bitwise the result of FP32 weights of the same values.
DSV41RT_API cudaError_t linear(const float* x, const kernels::WeightView& w, int64_t m, int64_t k,
                               int64_t n, float* y, bool accumulate, cudaStream_t stream);

DSV41RT_API cudaError_t grouped_linear(const float* x, const kernels::WeightView& w, int64_t m,
                                       int64_t groups, int64_t k_g, int64_t n_g, float* y,
                                       cudaStream_t stream);

}  // namespace dsv41rt::kernels::cuda
