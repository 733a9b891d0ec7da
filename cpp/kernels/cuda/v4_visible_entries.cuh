// CUDA V4 HCA selection (contract: kernels/indexer.h visible_entries): indices [S, k], row s =
// 0 .. min(n_visible[s], k) - 1 then -1 to width k, bitwise the CPU reference (integers only).
// Where the CPU reference throws on a negative n_visible (naming the row), this kernel cannot
// report without a host synchronisation: such a row is written as seeing no entry (all -1). The
// executor's plan never holds one. S == 0 or k == 0 is a no-op; S < 0 or k < 0 is
// cudaErrorInvalidValue.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/export.h"

namespace dsv41rt::kernels::cuda {

DSV41RT_API cudaError_t visible_entries(const int64_t* n_visible, int64_t S, int64_t k,
                                        int32_t* indices, cudaStream_t stream);

}  // namespace dsv41rt::kernels::cuda
