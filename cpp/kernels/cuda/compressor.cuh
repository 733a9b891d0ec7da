// CUDA compressor pooling (contract: kernels/compressor.h), FP32.
//   values, scores [groups·ratio, D], pooled [groups, D] (device pointers):
//   pooled[g, c] = Σ_t softmax_t(scores[g·ratio + t, c]) · values[g·ratio + t, c].
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/export.h"

namespace dsv41rt::kernels::cuda {

DSV41RT_API cudaError_t compress_pool(const float* values, const float* scores, int64_t groups,
                                      int64_t ratio, int64_t D, float* pooled, cudaStream_t stream);

}  // namespace dsv41rt::kernels::cuda
