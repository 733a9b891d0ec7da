// Non-owning view of a strided tensor in CPU or CUDA memory.
//
// Strides are in ELEMENTS. For fp4 (two elements per byte) only contiguous views are
// meaningful; nbytes() then counts packed bytes.
#pragma once

#include <cstdint>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"

namespace dsv41rt {

enum class DeviceType { kCpu, kCuda };

struct Device {
  DeviceType type = DeviceType::kCpu;
  int index = 0;
  bool operator==(const Device&) const = default;
};

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // elements; same rank as shape
  Device device;

  TensorView() = default;
  // Contiguous (row-major) view.
  TensorView(void* ptr, DType type, std::vector<int64_t> dims, Device dev = {})
      : data(ptr),
        dtype(type),
        shape(std::move(dims)),
        strides(contiguous_strides(shape)),
        device(dev) {}

  static std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape) {
    std::vector<int64_t> s(shape.size());
    int64_t stride = 1;
    for (size_t i = shape.size(); i-- > 0;) {
      s[i] = stride;
      stride *= shape[i];
    }
    return s;
  }

  int64_t ndim() const { return static_cast<int64_t>(shape.size()); }

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }

  // Bytes spanned by the elements, assuming the view is contiguous.
  int64_t nbytes() const { return bytes_for(dtype, numel()); }

  bool is_contiguous() const {
    if (strides.size() != shape.size()) return false;
    int64_t expected = 1;
    for (size_t i = shape.size(); i-- > 0;) {
      // Size-1 dimensions may carry any stride without affecting the layout.
      if (shape[i] != 1 && strides[i] != expected) return false;
      expected *= shape[i];
    }
    return true;
  }

  // e.g. "bf16[4096, 7168] cpu contiguous" or "f32[2, 3] strides=[1, 2] cuda:1".
  std::string describe() const {
    std::ostringstream os;
    os << dtype_name(dtype) << '[';
    for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
    os << ']';
    if (!is_contiguous()) {
      os << " strides=[";
      for (size_t i = 0; i < strides.size(); ++i) os << (i ? ", " : "") << strides[i];
      os << ']';
    }
    os << (device.type == DeviceType::kCpu ? " cpu" : " cuda:");
    if (device.type == DeviceType::kCuda) os << device.index;
    if (is_contiguous()) os << " contiguous";
    return os.str();
  }
};

}  // namespace dsv41rt
