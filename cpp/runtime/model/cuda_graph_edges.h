// The decode graphs' programmatic kernel -> kernel edges (programmatic dependent launch; every
// kernel of the library starts with kernels/cuda/common.cuh pdl_entry()).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dsv41rt::model {

/// Makes the graph's kernel -> kernel edges between this library's kernels programmatic; returns
/// the edges changed. Throws Error when the graph API fails.
int64_t make_kernel_edges_programmatic(cudaGraph_t graph);

}  // namespace dsv41rt::model
