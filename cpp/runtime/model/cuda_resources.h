// Small RAII helpers of the CUDA executor: checked CUDA calls, device allocations, growable
// device buffers, a pinned staging area for the per-forward metadata upload, streams and events.
// Host code only (cuda_runtime_api.h); built with DSV41RT_WITH_CUDA.
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

/// A device array that grows on demand; `generation` changes whenever the storage moves (a
/// captured graph that baked the old address must be re-captured).
template <typename T>
class DeviceArray {
 public:
  T* ensure(int64_t n, uint64_t& generation) {
    if (n > capacity_) {
      const int64_t cap = std::max<int64_t>(n, capacity_ + capacity_ / 2);
      mem_ = device_alloc(cap * int64_t(sizeof(T)));
      capacity_ = cap;
      ++generation;
    }
    return static_cast<T*>(mem_.get());
  }
  T* get() const { return static_cast<T*>(mem_.get()); }

 private:
  std::shared_ptr<void> mem_;
  int64_t capacity_ = 0;
};

/// Host-side packer of the per-forward metadata arrays into one pinned buffer, uploaded with
/// one copy; `device<T>(offset)` is the array's device address after upload().
class MetaUpload {
 public:
  ~MetaUpload() {
    if (pinned_) cudaFreeHost(pinned_);
  }
  void clear() { bytes_.clear(); }
  template <typename T>
  size_t add(const std::vector<T>& v) {
    const size_t at = (bytes_.size() + 15) / 16 * 16;
    bytes_.resize(at + v.size() * sizeof(T));
    if (!v.empty()) std::memcpy(bytes_.data() + at, v.data(), v.size() * sizeof(T));
    return at;
  }
  /// Copies the packed bytes to the device buffer on `stream` (the staging buffer must not be
  /// reused before the copy completes: the executor synchronises at the end of every forward).
  void upload(cudaStream_t stream, uint64_t& generation) {
    const int64_t n = std::max<int64_t>(int64_t(bytes_.size()), 16);
    if (n > pinned_capacity_) {
      if (pinned_) cudaFreeHost(pinned_);
      pinned_ = nullptr;
      DSV41RT_CU(cudaMallocHost(&pinned_, size_t(n) * 2));
      pinned_capacity_ = n * 2;
    }
    base_ = static_cast<uint8_t*>(device_.ensure(n, generation));
    std::memcpy(pinned_, bytes_.data(), bytes_.size());
    DSV41RT_CU(cudaMemcpyAsync(base_, pinned_, bytes_.size(), cudaMemcpyHostToDevice, stream));
  }
  const uint8_t* base() const { return base_; }
  template <typename T>
  T* device(size_t offset) const {
    return reinterpret_cast<T*>(base_ + offset);
  }

 private:
  std::vector<uint8_t> bytes_;
  void* pinned_ = nullptr;
  int64_t pinned_capacity_ = 0;
  DeviceArray<uint8_t> device_;
  uint8_t* base_ = nullptr;
};

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
