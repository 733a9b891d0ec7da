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

#ifdef __CUDACC__
/// First statement of every kernel: programmatic dependent launch (PDL). `griddepcontrol.wait`
/// returns once the grids this one depends on have completed and their memory is visible (at once
/// when launched without a programmatic dependency), so nothing of the kernel runs earlier than
/// under plain stream order; `launch_dependents` then lets the next kernel's blocks be scheduled
/// (to wait in turn) as this grid's blocks finish, instead of after the whole grid and a launch.
/// The decode graphs make kernel -> kernel edges programmatic (CudaBackend::capture), which is
/// only correct because every kernel of this library starts here: a new kernel must too.
__device__ __forceinline__ void pdl_entry() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
#endif

}  // namespace dsv41rt::kernels::cuda
