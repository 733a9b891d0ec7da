// CUDA cache quantisers and release-weight dequantisation (contract: kernels/quant.h). Every
// output is BITWISE equal to the CPU reference (kernels/cpu/quant.cc): the same scalar codecs
// (core/dtype.h), the same FP32 operations in the same order (IEEE division; by a power-of-two
// scale, the product with its exact reciprocal, which is the same quotient: quant_device.cuh
// div_pow2_like_host; no FMA contraction on the single products involved), max-reductions being
// order-independent.
//
// Shapes as in kernels/quant.h; all pointers are device pointers. dim must be a positive multiple
// of the format's block (v4_row: 512) and rows >= 0 (cudaErrorInvalidValue otherwise); y may
// alias x for QDQ.
// (Packed cache rows are written and read by the paged ops, kernels/cuda/paged.cuh.)
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/export.h"

namespace dsv41rt::kernels::cuda {

/// Cache QDQ, x [rows, dim] -> y [rows, dim].
DSV41RT_API cudaError_t fp8_window_qdq(const float* x, int64_t rows, int64_t dim, float* y,
                                       cudaStream_t stream);
/// GEMM activation QDQ (spec 5.2, precision "fp8"): BF16 rounding, then fp8_window_qdq.
DSV41RT_API cudaError_t fp8_act_qdq(const float* x, int64_t rows, int64_t dim, float* y,
                                    cudaStream_t stream);
/// fp8_act_qdq of x [rows, k] (row stride ldx) written as BF16 bits y [rows, k] (row stride ldy):
/// the staging of a precision-"fp8" linear's activations for the BF16 wgmma GEMM in one pass,
/// bitwise rows_to_bf16 of fp8_act_qdq's output (an E4M3 value times a power of two is exact in
/// BF16). Needs k % 32 == 0, ldx % 4 == 0, ldy % 4 == 0, x 16-byte and y 8-byte aligned
/// (fp8_act_qdq_bf16_supported); otherwise cudaErrorInvalidValue.
DSV41RT_API bool fp8_act_qdq_bf16_supported(const float* x, int64_t ldx, int64_t k,
                                            const uint16_t* y, int64_t ldy);
DSV41RT_API cudaError_t fp8_act_qdq_bf16(const float* x, int64_t ldx, int64_t rows, int64_t k,
                                         uint16_t* y, int64_t ldy, cudaStream_t stream);
/// DeepSeek-V4's row QDQ (kernels/quant.h v4_row_qdq): dim must be kV4RowDim (512).
DSV41RT_API cudaError_t v4_row_qdq(const float* x, int64_t rows, int64_t dim, float* y,
                                   cudaStream_t stream);
DSV41RT_API cudaError_t nvfp4_qdq(const float* x, int64_t rows, int64_t dim, float* y,
                                  cudaStream_t stream);
DSV41RT_API cudaError_t mxfp4_qdq(const float* x, int64_t rows, int64_t dim, float* y,
                                  cudaStream_t stream);

/// Release-weight dequantisation (kernels/quant.h dequant_fp8_blocks / dequant_fp4_rows) to BF16
/// bits, for weights kept BF16 on the device: exact for every
/// value in FP32's normal range (an FP8/FP4 code times a power of two has at most 4 significant
/// bits; BF16 keeps 8 and FP32's exponent range); values below 2^-126 round to nearest.
DSV41RT_API cudaError_t dequant_fp8_blocks_bf16(const uint8_t* codes, const uint8_t* scales,
                                                int64_t rows, int64_t cols, int64_t block_rows,
                                                int64_t block_cols, uint16_t* out,
                                                cudaStream_t stream);
DSV41RT_API cudaError_t dequant_fp4_rows_bf16(const uint8_t* packed, const uint8_t* scales,
                                              int64_t rows, int64_t cols, uint16_t* out,
                                              cudaStream_t stream);

}  // namespace dsv41rt::kernels::cuda
