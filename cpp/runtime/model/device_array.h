// A growable array in a backend's memory (host memory on the CPU, device memory on CUDA). The
// model runner keeps its activations and op scratch in these; `generation` changes whenever any
// of them moves, which invalidates CUDA graphs that baked the old addresses in.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>

namespace dsv41rt::model {

/// Backend memory of `bytes` bytes, freed with the returned pointer.
using Allocator = std::function<std::shared_ptr<void>(int64_t bytes)>;

template <typename T>
class DeviceArray {
 public:
  /// At least n elements (contents are dropped when it grows by half again or more).
  T* ensure(const Allocator& alloc, int64_t n, uint64_t& generation) {
    if (n > capacity_) {
      const int64_t cap = std::max<int64_t>(n, capacity_ + capacity_ / 2);
      mem_ = alloc(cap * int64_t(sizeof(T)));
      capacity_ = cap;
      ++generation;
    }
    return static_cast<T*>(mem_.get());
  }
  T* get() const { return static_cast<T*>(mem_.get()); }
  int64_t capacity() const { return capacity_; }

 private:
  std::shared_ptr<void> mem_;
  int64_t capacity_ = 0;
};

/// Scratch memory of one op call site, owned by the caller and lent to the op (kernels allocate
/// nothing): the op asks for the bytes it needs for the sizes at hand.
class Scratch {
 public:
  Scratch(const Allocator& alloc, DeviceArray<uint8_t>& array, uint64_t& generation)
      : alloc_(alloc), array_(array), generation_(generation) {}
  void* get(int64_t bytes) {
    return array_.ensure(alloc_, std::max<int64_t>(bytes, 1), generation_);
  }

 private:
  const Allocator& alloc_;
  DeviceArray<uint8_t>& array_;
  uint64_t& generation_;
};

}  // namespace dsv41rt::model
