// CUDA RMSNorm (contract: kernels/rms_norm.h): y = weight ⊙ x · rsqrt(mean(x²) + eps), FP32.
// x, y [rows, dim] device pointers (y may alias x); weight [dim] or nullptr.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/export.h"

namespace dsv41rt::kernels::cuda {

DSV41RT_API cudaError_t rms_norm(const float* x, const float* weight, int64_t rows, int64_t dim,
                                 float eps, float* y, cudaStream_t stream);

}  // namespace dsv41rt::kernels::cuda
