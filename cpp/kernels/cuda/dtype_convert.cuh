// Device-side dtype conversions (decode to f32).
//
// Each entry point converts `n` elements on `stream` from raw device pointers, allocates nothing
// and returns the launch status (cudaSuccess for n == 0). The element conversions are the same
// DSV41RT_HOST_DEVICE functions from core/dtype.h used on the host, so GPU and CPU results are
// bit-identical.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/export.h"

namespace dsv41rt::kernels {

// src: n fp8 e4m3 codes.
DSV41RT_API cudaError_t decode_fp8_e4m3_to_f32(const uint8_t* src, int64_t n, float* dst,
                                               cudaStream_t stream);
// src: n bf16 codes.
DSV41RT_API cudaError_t decode_bf16_to_f32(const uint16_t* src, int64_t n, float* dst,
                                           cudaStream_t stream);
// src: ceil(n/2) bytes of packed fp4 e2m1, even element in the low nibble.
DSV41RT_API cudaError_t decode_fp4_e2m1_packed_to_f32(const uint8_t* src, int64_t n, float* dst,
                                                      cudaStream_t stream);

}  // namespace dsv41rt::kernels
