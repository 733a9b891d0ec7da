// Test-entry helpers (host pointers in, host pointers out) used by the *_test_entry.cu files:
// copy inputs to the device, poison outputs, run, synchronise, copy back, turn CUDA errors into
// dsv41rt::Error. Production code never uses these: the executor passes its own device buffers.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "core/status.h"

namespace dsv41rt::kernels::cuda::testing {

#define DSV41RT_CUDA_CHECK(expr)                                          \
  do {                                                                    \
    const cudaError_t dsv41rt_err_ = (expr);                              \
    DSV41RT_CHECK_CODE(kInternal, dsv41rt_err_ == cudaSuccess, #expr,     \
                       " failed: ", cudaGetErrorName(dsv41rt_err_), ": ", \
                       cudaGetErrorString(dsv41rt_err_));                 \
  } while (0)

/// An owned device allocation; destruction never throws.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(int64_t n) : n_(n) {
    if (n_ > 0) DSV41RT_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&ptr_), bytes()));
  }
  /// Device copy of host data.
  DeviceBuffer(const T* host, int64_t n) : DeviceBuffer(n) {
    if (n_ > 0) DSV41RT_CUDA_CHECK(cudaMemcpy(ptr_, host, bytes(), cudaMemcpyHostToDevice));
  }
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() const { return ptr_; }
  size_t bytes() const { return size_t(n_) * sizeof(T); }
  /// Fill with 0xFF bytes (NaN for floats) so unwritten outputs are caught.
  void poison() {
    if (n_ > 0) DSV41RT_CUDA_CHECK(cudaMemset(ptr_, 0xFF, bytes()));
  }
  void to_host(T* host) const {
    if (n_ > 0) DSV41RT_CUDA_CHECK(cudaMemcpy(host, ptr_, bytes(), cudaMemcpyDeviceToHost));
  }

 private:
  T* ptr_ = nullptr;
  int64_t n_ = 0;
};

/// Checks a kernel's returned status, then synchronises to surface faults.
inline void finish(cudaError_t launched) {
  DSV41RT_CUDA_CHECK(launched);
  DSV41RT_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace dsv41rt::kernels::cuda::testing
