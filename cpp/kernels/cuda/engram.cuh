// CUDA Engram (contract: kernels/engram.h): n-gram hash rows and the gated residual update.
// Raw device pointers, the caller's stream; nothing is allocated (engram_forward takes its kv
// workspace from the caller).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/export.h"
#include "kernels/weight_view.h"

namespace dsv41rt::kernels::cuda {

/// Floats of workspace engram_forward needs: S * (n + 1) * H (the kv projection).
inline int64_t engram_forward_workspace(int64_t S, int64_t n, int64_t H) { return S * (n + 1) * H; }

/// In place on X [S, n, H] as kernels::cpu::engram_forward (the three per-stream reductions in
/// FP64). emb [S, D], wkv [(n + 1) H, D] in any stored format (decoded exactly, as the CPU's FP32
/// values), q_weight / k_weight [n, H], token_mask [S] or nullptr, kv_workspace:
/// engram_forward_workspace(S, n, H) floats (must not alias the other buffers). The projection
/// runs on CUDA cores, each output's sum in a fixed order whatever S (bitwise per token).
/// kv_ready: the workspace already holds the kv projection emb · wkv^T [S, (n + 1) H] (computed
/// by the caller, e.g. on tensor cores); emb and wkv are unused.
DSV41RT_API cudaError_t engram_forward(float* X, const float* emb, const kernels::WeightView& wkv,
                                       const float* q_weight, const float* k_weight,
                                       const uint8_t* token_mask, int64_t S, int64_t n, int64_t H,
                                       int64_t D, float eps, float* kv_workspace,
                                       cudaStream_t stream, bool kv_ready = false);

}  // namespace dsv41rt::kernels::cuda
