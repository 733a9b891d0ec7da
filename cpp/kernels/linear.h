// Contract: dense projections y = x · W^T on FP32 (the CPU reference computes everything in FP32;
// weights are dequantised from the release formats at load).
//
//   x [m, k] row-major, w [n, k] row-major (PyTorch [out, in]), y [m, n] row-major.
//   `accumulate` adds into y instead of overwriting it.
#pragma once

#include <cstdint>

#include "core/export.h"

namespace dsv41rt::kernels::cpu {

/// y[m, n] (=|+=) x[m, k] · w[n, k]^T. Deterministic for a fixed thread count and shape: each
/// output element is one k-ordered FP32 dot product (no split-k), so results do not depend on m.
DSV41RT_API void linear(const float* x, const float* w, int64_t m, int64_t k, int64_t n, float* y,
                        bool accumulate = false);

/// Rounds v[0, n) to BF16 (nearest even, as the GPU stages tensor-core inputs) in place: the CPU
/// emulation of precision "bf16".
DSV41RT_API void round_to_bf16(float* v, int64_t n);

/// What a GEMM's activation goes through before its FP32 products (the precision modes):
///   kFp32 nothing; kBf16 rounded to BF16 (W8A16 / W4A16: precision "bf16");
///   kFp8  rounded to BF16, then quantised to FP8 E4M3 in 1 x 32 blocks along k with
///         power-of-two scales and dequantised (fp8_act_qdq, kernels/quant.h): the official
///         inference numerics of spec section 5.2 (precision "fp8"). Its values are BF16-exact.
enum class GemmInputs { kFp32, kBf16, kFp8 };

/// v [rows, k] in place as `inputs` says (kFp8 needs k % 32 == 0; throws Error otherwise).
DSV41RT_API void round_gemm_inputs(float* v, int64_t rows, int64_t k, GemmInputs inputs);

/// Grouped projection (V4.1 `wo_a`): x [m, g, k_g], w [g, n_g, k_g] -> y [m, g, n_g], group by
/// group.
DSV41RT_API void grouped_linear(const float* x, const float* w, int64_t m, int64_t groups,
                                int64_t k_g, int64_t n_g, float* y);

}  // namespace dsv41rt::kernels::cpu
