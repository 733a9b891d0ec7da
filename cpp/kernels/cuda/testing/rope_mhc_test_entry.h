// Host-pointer entry points of the CUDA RoPE, mHC and linear kernels (kernels/cuda/rope.cuh,
// mhc.cuh, linear.cuh), for the device-parameterised op tests
// (tests/python/test_cuda_ops_rope_mhc_linear.py through dsv41rt._core.cuda_ops). Plain C++: no
// CUDA types. Each copies inputs to the device, poisons the outputs, runs on the default stream,
// synchronises and copies back; CUDA errors throw dsv41rt::Error. Shapes as in the contract
// headers kernels/rope.h, mhc.h and linear.h.
#pragma once

#include <cstdint>

#include "core/export.h"

namespace dsv41rt::kernels::cuda::testing {

/// y = x rotated (the kernel runs in place on a device copy of x [rows, heads, head_dim]).
DSV41RT_API void apply_rope(const float* x, int64_t rows, int64_t heads, int64_t head_dim,
                            int64_t rope_dim, const int64_t* positions, const float* inv_freq,
                            bool inverse, float* y);

DSV41RT_API void hc_mix(const float* X, const float* fn, const float* base, const float* scale,
                        int64_t S, int64_t n, int64_t H, float rms_eps, float hc_eps, int iters,
                        float* pre, float* post, float* comb);
DSV41RT_API void hc_collapse(const float* X, const float* w, int64_t S, int64_t n, int64_t H,
                             float* u);
DSV41RT_API void hc_expand(const float* X, const float* y, const float* post, const float* comb,
                           int64_t S, int64_t n, int64_t H, float* out);

/// y[m, n] (=|+=) x[m, k] · w[n, k]^T; with accumulate, y holds the initial values on entry.
DSV41RT_API void linear(const float* x, const float* w, int64_t m, int64_t k, int64_t n, float* y,
                        bool accumulate);
/// x [m, groups, k_g], w [groups, n_g, k_g] -> y [m, groups, n_g].
DSV41RT_API void grouped_linear(const float* x, const float* w, int64_t m, int64_t groups,
                                int64_t k_g, int64_t n_g, float* y);

}  // namespace dsv41rt::kernels::cuda::testing
