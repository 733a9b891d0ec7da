// CUDA rotary position embedding (contract: kernels/rope.h, apply_rope), FP32, in place.
// x [rows, heads, head_dim] device pointer; the LAST rope_dim channels of each head are rotated as
// interleaved pairs (2k, 2k+1) by φ = float(positions[r]) · inv_freq[k] (FP32 product), with
// c = cosf(φ), s = sinf(φ); inverse rotates by the conjugate. positions [rows] int64 and
// inv_freq [rope_dim / 2] are device pointers. Each complex-multiply product is rounded to FP32
// before the add (no FMA contraction), as the CPU reference; only device cosf/sinf differ from
// the host libm by an ulp or two. rope_dim must be even with 0 < rope_dim <= head_dim.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/export.h"

namespace dsv41rt::kernels::cuda {

DSV41RT_API cudaError_t apply_rope(float* x, int64_t rows, int64_t heads, int64_t head_dim,
                                   int64_t rope_dim, const int64_t* positions,
                                   const float* inv_freq, bool inverse, cudaStream_t stream);

}  // namespace dsv41rt::kernels::cuda
