// numpy <-> C++ array helpers shared by the op bindings: borrowed C-contiguous host inputs and
// fresh numpy outputs that own their buffer.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstddef>
#include <initializer_list>

namespace dsv41rt::bindings {

template <typename T, size_t N>
using In = nanobind::ndarray<const T, nanobind::ndim<N>, nanobind::c_contig, nanobind::device::cpu>;
template <typename T>
using Out = nanobind::ndarray<nanobind::numpy, T>;

/// A fresh numpy array of `shape` owning a new[] buffer (contents uninitialised).
template <typename T>
Out<T> new_array(std::initializer_list<size_t> shape) {
  size_t n = 1;
  for (size_t d : shape) n *= d;
  T* data = new T[n > 0 ? n : 1];
  nanobind::capsule owner(data, [](void* p) noexcept { delete[] static_cast<T*>(p); });
  return Out<T>(data, shape, owner);
}

}  // namespace dsv41rt::bindings
