// Contract: V4.1 compressor pooling (architecture spec §2.6.1). Ratio m = 1 is a plain projection
// (callers use `linear` + `rms_norm`); ratio m >= 2 pools every complete group of m tokens with a
// per-channel softmax over the group's gate scores:
//
//   values, scores [G·m, D] (FP32 projections x·wkvᵀ and x·wgateᵀ of the group's tokens)
//   pooled [G, D]: pooled[g, c] = Σ_t softmax_t(scores[g·m + t, c]) · values[g·m + t, c]
//
// Incomplete trailing groups are the caller's pending state; they never reach this op.
#pragma once

#include <cstdint>

#include "core/export.h"

namespace dsv41rt::kernels::cpu {

DSV41RT_API void compress_pool(const float* values, const float* scores, int64_t groups,
                               int64_t ratio, int64_t D, float* pooled);

}  // namespace dsv41rt::kernels::cpu
