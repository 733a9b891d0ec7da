// CUDA MoE router and routed + shared clamped-SwiGLU experts (contract: kernels/moe.h), FP32.
// Raw device pointers, the caller's stream; nothing is allocated.
//   x [S, H]; gate_w [E, H]; bias [E] or nullptr; idx int32 / weight [S, k];
//   w1, w3 [E, I, H] (stacked gate / up), w2 [E, H, I] (stacked down);
//   shared_w1, shared_w3 [I_shared, H], shared_w2 [H, I_shared] (all three nullptr = no shared).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/export.h"
#include "kernels/weight_view.h"

namespace dsv41rt::kernels::cuda {

/// Score routing exactly as kernels::cpu::moe_route: the logits are the CPU's 8-lane FP32 dot
/// products (same summation order, no FMA contraction), so expert selection matches the CPU
/// bit for bit up to the last-ulp differences of exp / log1p (rounded through FP64 here).
/// Requires 1 <= k <= E <= 1024 (cudaErrorInvalidValue otherwise). A cluster of 8 blocks per
/// token, each staging its experts' gate rows in up to 200 KB of dynamic shared memory
/// (kernels/cuda/moe_route.cu says why).
DSV41RT_API cudaError_t moe_route(const float* x, const float* gate_w, const float* bias, int64_t S,
                                  int64_t H, int64_t E, int64_t k, float routed_scaling_factor,
                                  bool normalize, int32_t* idx, float* weight, cudaStream_t stream);

/// y [S, H] (overwritten) = Σ over the token's k slots (ascending expert id, then slot) of
/// clamped-SwiGLU expert idx[t, j] with row scale weight[t, j] applied before w2, plus the shared
/// expert (weight 1) when shared_w1 != nullptr. limit <= 0 disables the clamps. idx entries must
/// lie in [0, E) (entries outside are skipped, not read). y must not alias x.
/// One block per token; dynamic shared memory (H + max(I, I_shared)) * 4 bytes.
DSV41RT_API cudaError_t moe_forward(const float* x, const int32_t* idx, const float* weight,
                                    int64_t S, int64_t H, int64_t k, int64_t E, int64_t I,
                                    const float* w1, const float* w3, const float* w2,
                                    const float* shared_w1, const float* shared_w3,
                                    const float* shared_w2, int64_t I_shared, float limit, float* y,
                                    cudaStream_t stream);

/// Floats of workspace moe_forward_split needs to do S tokens in one pass (it does fewer per pass
/// when given less, down to one token: S * (k + 1) * max(I, I_shared) is the whole batch).
DSV41RT_API int64_t moe_split_workspace_floats(int64_t S, int64_t k, int64_t I, int64_t I_shared);

/// moe_forward with the weights as stored (kernels/weight_view.h; routed w1/w3 one view of
/// [E * I, H] rows, w2 of [E * H, I]; the three routed matrices share one format, the three shared
/// ones another; shared_w1.data == nullptr: no shared expert), many blocks per token, in passes of
/// workspace_floats / moe_split_workspace_floats(1, ...) tokens. Every format decodes exactly to
/// FP32, so the result is bitwise moe_forward's over FP32 weights of the same values.
/// cudaErrorInvalidValue when a view does not cover its shape or the workspace holds no token.
DSV41RT_API cudaError_t moe_forward_split(
    const float* x, const int32_t* idx, const float* weight, int64_t S, int64_t H, int64_t k,
    int64_t E, int64_t I, const kernels::WeightView& w1, const kernels::WeightView& w3,
    const kernels::WeightView& w2, const kernels::WeightView& shared_w1,
    const kernels::WeightView& shared_w3, const kernels::WeightView& shared_w2, int64_t I_shared,
    float limit, float* y, float* workspace, int64_t workspace_floats, cudaStream_t stream);

/// A rank's local expert ids (contract: kernels/moe.h moe_local_ids); bitwise the CPU's.
DSV41RT_API cudaError_t moe_local_ids(const int32_t* idx, int64_t n, int64_t begin, int64_t count,
                                      int32_t* out, cudaStream_t stream);

}  // namespace dsv41rt::kernels::cuda
