// CUDA Engram (contract: kernels/engram.h): n-gram hash rows and the gated residual update.
// Raw device pointers, the caller's stream; nothing is allocated. The kv projection is a linear
// (the backend's, reading engram.wkv as stored).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/export.h"

namespace dsv41rt::kernels::cuda {

/// In place on X [S, n, H] as kernels::cpu::engram_update (the three per-stream reductions in
/// FP64): kv [S, (n + 1) H] (the projection emb · wkv^T, computed by the caller as a linear),
/// q_weight / k_weight [n, H], token_mask [S] or nullptr.
DSV41RT_API cudaError_t engram_update(float* X, const float* kv, const float* q_weight,
                                      const float* k_weight, const uint8_t* token_mask, int64_t S,
                                      int64_t n, int64_t H, float eps, cudaStream_t stream);

}  // namespace dsv41rt::kernels::cuda
