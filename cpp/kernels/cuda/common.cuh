// Shared helpers of the CUDA kernels: launch geometry and error propagation. Kernels take raw
// device pointers and a stream, allocate nothing, and return cudaError_t (style guide §7.5).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace dsv41rt::kernels::cuda {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65535;

/// Blocks for a grid-stride loop over n items (capped so any n fits gridDim.x).
inline int blocks_for(int64_t n, int threads = kThreads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<int>(blocks < 1 ? 1 : (blocks < kMaxBlocks ? blocks : kMaxBlocks));
}

/// The launch status: configuration errors surface here, faults at the next synchronisation.
inline cudaError_t launch_status() { return cudaGetLastError(); }

}  // namespace dsv41rt::kernels::cuda
