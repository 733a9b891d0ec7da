// CUDA Walsh-Hadamard transform (contract: kernels/hadamard.h; CPU reference:
// kernels/cpu/hadamard.cc). Bitwise equal to the CPU reference: every element goes through the
// contract's FP32 sequence (the butterfly stages h = 1, 2, ..., dim/2 as single rounded adds and
// subtracts, then one product with the FP32 dim^-0.5 rounded from double on the host).
//
// x, y [rows, dim] device pointers, y may alias x. dim a power of two in [1, kMaxHadamardDim]
// (a row is staged in shared memory), rows >= 0; cudaErrorInvalidValue otherwise. No host
// synchronisation, no allocation (graph-capturable).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/export.h"

namespace dsv41rt::kernels::cuda {

/// The largest row the kernel transforms (32 KiB of shared memory a block).
constexpr int64_t kMaxHadamardDim = 8192;

DSV41RT_API cudaError_t walsh_hadamard(const float* x, int64_t rows, int64_t dim, float* y,
                                       cudaStream_t stream);

}  // namespace dsv41rt::kernels::cuda
