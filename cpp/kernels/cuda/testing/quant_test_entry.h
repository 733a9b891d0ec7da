// Host-pointer entry points of the CUDA quant kernels (kernels/cuda/quant.cuh), for the
// device-parameterised op tests (tests/python/test_cuda_ops_quant.py through
// dsv41rt._core.cuda_ops). Plain C++: no CUDA types. Each copies inputs to the device, poisons the
// outputs, runs on the default stream, synchronises and copies back; CUDA errors (including
// cudaErrorInvalidValue for bad shapes) throw dsv41rt::Error. Shapes as in kernels/quant.h.
#pragma once

#include <cstdint>

#include "core/export.h"

namespace dsv41rt::kernels::cuda::testing {

DSV41RT_API void fp8_window_qdq(const float* x, int64_t rows, int64_t dim, float* y);
DSV41RT_API void nvfp4_qdq(const float* x, int64_t rows, int64_t dim, float* y);
DSV41RT_API void mxfp4_qdq(const float* x, int64_t rows, int64_t dim, float* y);

DSV41RT_API void fp8_window_pack(const float* x, int64_t rows, int64_t dim, uint8_t* out);
DSV41RT_API void fp8_window_unpack(const uint8_t* in, int64_t rows, int64_t dim, float* y);
DSV41RT_API void nvfp4_pack(const float* x, int64_t rows, int64_t dim, uint8_t* out);
DSV41RT_API void nvfp4_unpack(const uint8_t* in, int64_t rows, int64_t dim, float* y);
DSV41RT_API void mxfp4_pack(const float* x, int64_t rows, int64_t dim, uint8_t* out);
DSV41RT_API void mxfp4_unpack(const uint8_t* in, int64_t rows, int64_t dim, float* y);

DSV41RT_API void dequant_fp8_blocks(const uint8_t* codes, const uint8_t* scales, int64_t rows,
                                    int64_t cols, int64_t block_rows, int64_t block_cols,
                                    float* out);
DSV41RT_API void dequant_fp4_rows(const uint8_t* packed, const uint8_t* scales, int64_t rows,
                                  int64_t cols, float* out);

}  // namespace dsv41rt::kernels::cuda::testing
