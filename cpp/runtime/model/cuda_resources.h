// Small RAII helpers of the CUDA backend: checked CUDA calls, device allocations, streams and
// events. Host code only (cuda_runtime_api.h); built with DSV41RT_WITH_CUDA.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "core/status.h"

namespace dsv41rt::model::cudart {

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    // A failed call also leaves its error as the thread's last error: taken here, so that the
    // next kernel launch's check (cudaGetLastError) does not report it again. A sticky error
    // stays in the context and fails every later call anyway.
    cudaGetLastError();
    DSV41RT_THROW_CODE(kInternal, what, " failed: ", cudaGetErrorName(e), ": ",
                       cudaGetErrorString(e));
  }
}
#define DSV41RT_CU(expr) ::dsv41rt::model::cudart::check((expr), #expr)

/// Device memory owned by the returned pointer (freed on the last release; never throws).
inline std::shared_ptr<void> device_alloc(int64_t bytes) {
  void* p = nullptr;
  if (bytes > 0) {
    const cudaError_t e = cudaMalloc(&p, size_t(bytes));
    DSV41RT_CHECK_CODE(kOutOfRange, e == cudaSuccess, "cudaMalloc of ", bytes,
                       " bytes failed: ", cudaGetErrorString(e));
  }
  return std::shared_ptr<void>(p, [](void* q) {
    if (q) cudaFree(q);
  });
}

class Stream {
 public:
  Stream() { DSV41RT_CU(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
  ~Stream() {
    if (s_) cudaStreamDestroy(s_);
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

class Event {
 public:
  Event() { DSV41RT_CU(cudaEventCreateWithFlags(&e_, cudaEventDisableTiming)); }
  ~Event() {
    if (e_) cudaEventDestroy(e_);
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  /// Records on `from` and makes `to` wait for it (a no-op when both are the same stream).
  void link(cudaStream_t from, cudaStream_t to) {
    if (from == to) return;
    DSV41RT_CU(cudaEventRecord(e_, from));
    DSV41RT_CU(cudaStreamWaitEvent(to, e_, 0));
  }
  cudaEvent_t get() const { return e_; }

 private:
  cudaEvent_t e_ = nullptr;
};

/// An event that records time (for the per-forward device timing).
class TimingEvent {
 public:
  TimingEvent() { DSV41RT_CU(cudaEventCreate(&e_)); }
  ~TimingEvent() {
    if (e_) cudaEventDestroy(e_);
  }
  TimingEvent(const TimingEvent&) = delete;
  TimingEvent& operator=(const TimingEvent&) = delete;
  cudaEvent_t get() const { return e_; }

 private:
  cudaEvent_t e_ = nullptr;
};

}  // namespace dsv41rt::model::cudart
