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

#include <cstddef>
#include <cstdint>

#include "core/export.h"
#include "kernels/attention_cached.h"

namespace dsv41rt::kernels::cuda {

/// The same over two key arrays without copying them together: index j < T_a is row j of kv_a,
/// T_a <= j < T_a + T_b is row j - T_a of kv_b (the executor's window rows and the ratio's
/// dequant workspace).
DSV41RT_API cudaError_t sparse_attention_split(const float* q, const float* kv_a, int64_t T_a,
                                               const float* kv_b, int64_t T_b,
                                               const int32_t* indices, const float* sink, int64_t S,
                                               int64_t n_heads, int64_t D, int64_t K, float scale,
                                               float* out, cudaStream_t stream);

/// The same on tensor cores (kernels/cuda/attention_tc.cu), for key arrays whose every element is
/// a BF16 value (the quantised caches' rows: spec §5.5). Queries and probabilities are split into
/// three BF16 parts, so every product is the FP32 reference's; sums are FP32 in another order
/// (the tensor core's accumulation, 4 key slices combined in rank order): ~1e-6 relative. A key
/// element that is not a BF16 value is rounded to one (the caller's precondition, not checked).
/// Requires sparse_attention_tc_supported (cudaErrorInvalidValue otherwise).
DSV41RT_API cudaError_t sparse_attention_tc(const float* q, const float* kv_a, int64_t T_a,
                                            const float* kv_b, int64_t T_b, const int32_t* indices,
                                            const float* sink, int64_t S, int64_t n_heads,
                                            int64_t D, int64_t K, float scale, float* out,
                                            cudaStream_t stream);

/// sparse_attention_tc with the keys read from the caches as stored (kernels/attention_cached.h):
/// bitwise sparse_attention_tc over the unpacked arrays. Stored rows are read with the widest
/// loads their alignment allows; indices outside their item's rows are skipped like -1. Requires
/// sparse_attention_tc_supported(D, q, keys.new_rows, keys.new_rows).
DSV41RT_API cudaError_t sparse_attention_tc_cached(const float* q, const CachedKeys& keys,
                                                   const int32_t* indices, const float* sink,
                                                   int64_t S, int64_t n_heads, int64_t D, int64_t K,
                                                   float scale, float* out, cudaStream_t stream);

/// The same products for forwards with many query rows (kernels/cuda/attention_prefill_tc.cu): a
/// block per query and 64 heads, the key list in 32-key chunks through a cp.async pipeline, no
/// split of the key list (so a row's bits differ from sparse_attention_tc's at summation-order
/// level, and never depend on the batch). `workspace` (16-byte aligned) holds
/// sparse_attention_prefill_tc_workspace bytes: the key arrays' BF16 copy the kernel reads.
DSV41RT_API cudaError_t sparse_attention_prefill_tc(const float* q, const float* kv_a, int64_t T_a,
                                                    const float* kv_b, int64_t T_b,
                                                    const int32_t* indices, const float* sink,
                                                    int64_t S, int64_t n_heads, int64_t D,
                                                    int64_t K, float scale, void* workspace,
                                                    float* out, cudaStream_t stream);
DSV41RT_API size_t sparse_attention_prefill_tc_workspace(int64_t T_a, int64_t T_b, int64_t D);

/// D a multiple of 64 up to 512 and q, kv_a, kv_b 16-byte aligned.
DSV41RT_API bool sparse_attention_tc_supported(int64_t D, const float* q, const float* kv_a,
                                               const float* kv_b);

}  // namespace dsv41rt::kernels::cuda
