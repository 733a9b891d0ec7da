// CUDA manifold-constrained hyper-connections (contract: kernels/mhc.h), FP32, device pointers.
//
// hc_mix: the mixer projection f · fn^T and Σ f² in fixed chunks of 512 of the n·H inputs, one
//   block per (token, chunk) (FP32 FMA per output by one warp, Σ f² in double as the CPU rms_inv),
//   then one block per token adds the chunks in order (a different summation order than the CPU's
//   8-lane dot: ~1e-6 relative; independent of the batch) and follows the CPU's FP32 operation
//   order exactly for everything after (scale/base, sigmoids, Sinkhorn; no FMA contraction), with
//   device expf (<= 2 ulp). Needs ~(2 + n)·n·(1 + n·H/512) floats of shared memory (<= 48 KB:
//   n·H up to ~65k at n = 4) and
//   hc_mix_workspace_bytes of device workspace (cudaErrorInvalidValue when smaller).
// hc_collapse / hc_expand: one thread per output element, the CPU's summation order and
//   roundings (i ascending, products rounded before the add): bitwise equal to the CPU reference.
// Outputs must not alias inputs. S == 0 is a no-op; n <= 0, H <= 0, iters < 1 are
// cudaErrorInvalidValue.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/export.h"

namespace dsv41rt::kernels::cuda {

/// Device workspace hc_mix needs for S tokens.
DSV41RT_API int64_t hc_mix_workspace_bytes(int64_t S, int64_t n, int64_t H);

/// X [S, n, H], fn [W, n·H], base [W], scale [3] -> pre [S, n], post [S, n], comb [S, n, n].
DSV41RT_API cudaError_t hc_mix(const float* X, const float* fn, const float* base,
                               const float* scale, int64_t S, int64_t n, int64_t H, float rms_eps,
                               float hc_eps, int iters, float* pre, float* post, float* comb,
                               void* workspace, int64_t workspace_bytes, cudaStream_t stream);

/// u[S, H] = Σ_i w[s, i] · X[s, i, :].
DSV41RT_API cudaError_t hc_collapse(const float* X, const float* w, int64_t S, int64_t n, int64_t H,
                                    float* u, cudaStream_t stream);

/// out[s, o, :] = post[s, o] · y[s, :] + Σ_i comb[s, i, o] · X[s, i, :].
DSV41RT_API cudaError_t hc_expand(const float* X, const float* y, const float* post,
                                  const float* comb, int64_t S, int64_t n, int64_t H, float* out,
                                  cudaStream_t stream);

}  // namespace dsv41rt::kernels::cuda
