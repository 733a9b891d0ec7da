// CUDA V4 hyper-head collapse weights (contract: kernels/mhc.h hc_head_pre): X [S, n, H],
// fn [n, n·H], base [n], scale [1] -> pre [S, n], FP32, device pointers.
//
// The contract defines pre as exactly hc_mix's pre with W = n, so this kernel repeats the CUDA
// hc_mix's arithmetic for those rows (kernels/cuda/mhc.cu, whose kernels are private to it): the
// projection and Σ f² in chunks of 512 inputs (per chunk: a warp's FMA dot per row with the lanes
// strided, an xor-shuffle reduction; Σ f² in double, thread-strided over 256 threads, the warps in
// order), the chunks added in order, then the same FP32 steps and device expf. Its pre is thus
// bitwise the CUDA hc_mix's pre of the same rows (tests/cpp/test_backend_mhc.cc checks it), and
// differs from the CPU reference (8-lane dot) by FP32 summation order and expf's last ulp; the
// bound is stated in tests/cpp/test_cuda_v4_ops.cc. One block per token walks the chunks itself
// (hc_mix spreads them over blocks through a workspace, which this op, called once per forward,
// has no need of), so it needs no workspace and is graph-capturable.
// S == 0 is a no-op; n <= 0, H <= 0, S < 0 are cudaErrorInvalidValue. pre must not alias X.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/export.h"

namespace dsv41rt::kernels::cuda {

DSV41RT_API cudaError_t hc_head_pre(const float* X, const float* fn, const float* base,
                                    const float* scale, int64_t S, int64_t n, int64_t H,
                                    float rms_eps, float hc_eps, float* pre, cudaStream_t stream);

}  // namespace dsv41rt::kernels::cuda
