// CUDA sparse attention with a per-head sink (contract: kernels/attention.h), FP32.
//   q [S, n_heads, D], kv [T, D], indices int32 [S, K] (-1 = skip), sink [n_heads],
//   out [S, n_heads, D] (device pointers; out must not alias the inputs).
// Indices outside [-1, T) are device data the launcher cannot check: the kernel skips them like
// -1 (never reads out of bounds); the CPU reference rejects them instead. A query with no valid
// index gets a zero output. A block serves 8 heads of a query (each key row is read once for all
// of them) and each query's K keys are split over a cluster of 8 blocks (fixed, so a row's result
// does not depend on the batch) whose partial softmax sums are combined in rank order: FP32 sums
// in another order than the CPU's, ~1e-6 relative. Requires D <= 512 and D % 4 == 0
// (cudaErrorInvalidValue otherwise; V4 and V4.1 have D = 512).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/export.h"

namespace dsv41rt::kernels::cuda {

/// The same over two key arrays without copying them together: index j < T_a is row j of kv_a,
/// T_a <= j < T_a + T_b is row j - T_a of kv_b (the executor's window rows and the ratio's
/// dequant workspace).
DSV41RT_API cudaError_t sparse_attention_split(const float* q, const float* kv_a, int64_t T_a,
                                               const float* kv_b, int64_t T_b,
                                               const int32_t* indices, const float* sink, int64_t S,
                                               int64_t n_heads, int64_t D, int64_t K, float scale,
                                               float* out, cudaStream_t stream);

}  // namespace dsv41rt::kernels::cuda
