// CUDA V4 hash routing (contract: kernels/moe.h moe_route_hash, normalised, as the Backend op
// calls it): idx[t, j] = tid2eid[tokens[t], j] and weight = s[idx] / (Σ_j s[idx] + 1e-20) · scale
// with s = sqrt(softplus(x · gate^T)), the sum in slot order, for every k (k = 1 included).
//
// Exactness: only the k routed experts' logits are computed, each as the CPU's 8-lane FP32 dot
// (kernels/cpu/linear.cc `dot`: same products, same summation order, no FMA contraction), and
// softplus goes through FP64 as the score router's (moe_route_common.cuh), so idx is bitwise the
// CPU's and the weights are bitwise up to the last-ulp differences of exp / log1p.
//
// Token ids arrive as the plan's int32 device array (the CPU backend widens them to the
// reference's int64 on the host). The checks the CPU reference makes by throwing cannot report
// from the device without a host synchronisation: a token id outside [0, vocab) or a table entry
// outside [0, E) makes that token's k slots idx -1 (which the expert kernels skip) and weight NaN.
// The executor never passes either: the planner validates token ids and the loader every tid2eid
// entry. S == 0 is a no-op; S < 0, H <= 0, E <= 0, k < 1, vocab < 1 are cudaErrorInvalidValue.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/export.h"

namespace dsv41rt::kernels::cuda {

/// x [S, H], gate [E, H], tid2eid [vocab, k], tokens [S] -> idx, weight [S, k].
DSV41RT_API cudaError_t moe_route_hash(const float* x, const float* gate, const int32_t* tid2eid,
                                       const int32_t* tokens, int64_t S, int64_t H, int64_t E,
                                       int64_t k, int64_t vocab, float routed_scaling_factor,
                                       int32_t* idx, float* weight, cudaStream_t stream);

}  // namespace dsv41rt::kernels::cuda
