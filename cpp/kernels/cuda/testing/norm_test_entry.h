// Host-pointer entry points of the CUDA norm-family kernels, for the device-parameterised op tests
// (tests/python/test_cuda_ops_*.py through dsv41rt._core.cuda_ops). Plain C++: no CUDA types, so
// the bindings compile without CUDA headers. Each copies inputs to the device, poisons the output,
// runs on the default stream, synchronises and copies back; CUDA errors throw dsv41rt::Error.
#pragma once

#include <cstdint>

#include "core/export.h"

namespace dsv41rt::kernels::cuda::testing {

DSV41RT_API void rms_norm(const float* x, const float* weight /*nullable*/, int64_t rows,
                          int64_t dim, float eps, float* y);

}  // namespace dsv41rt::kernels::cuda::testing
