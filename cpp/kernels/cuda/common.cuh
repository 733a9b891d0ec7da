// Shared helpers of the CUDA kernels: launch geometry and error propagation. Kernels take raw
// device pointers and a stream, allocate nothing, and return cudaError_t (style guide §7.5).
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
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

/// Lets Kernel use `bytes` of dynamic shared memory (above the 48 KB default) on the current
/// device. The attribute is per function and device: it is set once per device (devices 0..63;
/// others set it on every call), not on every launch. Thread-safe; allowed during graph capture.
template <auto Kernel>
cudaError_t allow_dynamic_smem(int bytes) {
  static std::atomic<uint64_t> done{0};  // bit d: set on device d
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  const uint64_t bit = dev < 64 ? uint64_t(1) << dev : 0;
  if (bit != 0 && (done.load(std::memory_order_acquire) & bit) != 0) return cudaSuccess;
  e = cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e == cudaSuccess) done.fetch_or(bit, std::memory_order_release);
  return e;
}

}  // namespace dsv41rt::kernels::cuda
