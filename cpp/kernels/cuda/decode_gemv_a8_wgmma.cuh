// The wgmma path of the A8 decode GEMM (internal to kernels/cuda; the contract is
// decode_gemv_a8.cuh). Arguments are checked by decode_gemv_a8().
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/decode_gemv_a8.cuh"

namespace dsv41rt::kernels::cuda {

/// The most 128-column pieces one split may hold (its scale codes live in shared memory).
constexpr int64_t kA8WgmmaMaxPiecesPerSplit = 128;

/// Split-K count of the wgmma path for n rows and `pieces` 128-column pieces.
int64_t decode_gemv_a8_wgmma_splits(int64_t n, int64_t pieces);

/// Launches the wgmma kernel (and nothing else: the caller reduces the split partials).
cudaError_t decode_gemv_a8_wgmma_launch(const DecodeGemvA8& g, int64_t splits, float* workspace,
                                        cudaStream_t stream);

}  // namespace dsv41rt::kernels::cuda
