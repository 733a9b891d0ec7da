// dsv41rt._core.ops bindings of the quant ops (kernels/quant.h): cache QDQ, packed cache rows and
// release-format weight dequantisation, numpy in / numpy out (fresh arrays), GIL released around
// the compute.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <vector>

#include "core/status.h"
#include "kernels/quant.h"

namespace nb = nanobind;

namespace dsv41rt::bindings {
namespace {

using F32In = nb::ndarray<const float, nb::c_contig, nb::device::cpu>;
using U8In = nb::ndarray<const uint8_t, nb::c_contig, nb::device::cpu>;
using U8In2 = nb::ndarray<const uint8_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using AnyIn2 = nb::ndarray<nb::ro, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using OutArray = nb::ndarray<nb::numpy>;

template <typename T>
OutArray new_array(const std::vector<size_t>& shape, T** out) {
  size_t n = 1;
  for (size_t s : shape) n *= s;
  T* buf = new T[n ? n : 1];
  nb::capsule owner(buf, [](void* p) noexcept { delete[] static_cast<T*>(p); });
  *out = buf;
  return OutArray(buf, shape.size(), shape.data(), owner, nullptr, nb::dtype<T>());
}

// Leading dims and last dim of an [..., last] array.
template <typename A>
std::vector<size_t> shape_of(const A& a, const char* op, int64_t* rows, int64_t* last) {
  DSV41RT_CHECK(a.ndim() >= 1, op, ": expected an array of shape [..., dim], got a scalar");
  std::vector<size_t> shape(a.ndim());
  int64_t r = 1;
  for (size_t i = 0; i < a.ndim(); ++i) {
    shape[i] = a.shape(i);
    if (i + 1 < a.ndim()) r *= static_cast<int64_t>(a.shape(i));
  }
  *rows = r;
  *last = static_cast<int64_t>(a.shape(a.ndim() - 1));
  return shape;
}

using QdqFn = void (*)(const float*, int64_t, int64_t, float*);
using PackFn = void (*)(const float*, int64_t, int64_t, uint8_t*);
using UnpackFn = void (*)(const uint8_t*, int64_t, int64_t, float*);
using RowBytesFn = int64_t (*)(int64_t);

OutArray qdq_np(const F32In& x, QdqFn fn, const char* op) {
  int64_t rows = 0, dim = 0;
  const std::vector<size_t> shape = shape_of(x, op, &rows, &dim);
  float* y = nullptr;
  OutArray out = new_array<float>(shape, &y);
  nb::gil_scoped_release release;
  fn(x.data(), rows, dim, y);
  return out;
}

OutArray pack_np(const F32In& x, PackFn fn, RowBytesFn row_bytes, const char* op) {
  int64_t rows = 0, dim = 0;
  std::vector<size_t> shape = shape_of(x, op, &rows, &dim);
  shape.back() = static_cast<size_t>(row_bytes(dim));  // dim itself is checked by the kernel
  uint8_t* y = nullptr;
  OutArray out = new_array<uint8_t>(shape, &y);
  nb::gil_scoped_release release;
  fn(x.data(), rows, dim, y);
  return out;
}

// dim = row_bytes * num / den must be exact and consistent.
OutArray unpack_np(const U8In& in, UnpackFn fn, RowBytesFn row_bytes, int64_t num, int64_t den,
                   const char* op) {
  int64_t rows = 0, rb = 0;
  std::vector<size_t> shape = shape_of(in, op, &rows, &rb);
  const int64_t dim = rb * num / den;
  DSV41RT_CHECK(dim > 0 && row_bytes(dim) == rb, op, ": last dim ", rb,
                " is not a packed row size of this format");
  shape.back() = static_cast<size_t>(dim);
  float* y = nullptr;
  OutArray out = new_array<float>(shape, &y);
  nb::gil_scoped_release release;
  fn(in.data(), rows, dim, y);
  return out;
}

OutArray dequant_fp8_blocks_np(const U8In2& codes, const U8In2& scales, int64_t block_rows,
                               int64_t block_cols) {
  DSV41RT_CHECK(block_rows > 0 && block_cols > 0,
                "dequant_fp8_blocks: block sizes must be positive, got ", block_rows, "x",
                block_cols);
  const int64_t rows = static_cast<int64_t>(codes.shape(0));
  const int64_t cols = static_cast<int64_t>(codes.shape(1));
  const int64_t sr = (rows + block_rows - 1) / block_rows;
  const int64_t sc = (cols + block_cols - 1) / block_cols;
  DSV41RT_CHECK(
      static_cast<int64_t>(scales.shape(0)) == sr && static_cast<int64_t>(scales.shape(1)) == sc,
      "dequant_fp8_blocks: scales have shape [", scales.shape(0), ", ", scales.shape(1),
      "], expected [", sr, ", ", sc, "] for weight [", rows, ", ", cols, "] and blocks ",
      block_rows, "x", block_cols);
  float* y = nullptr;
  OutArray out = new_array<float>({size_t(rows), size_t(cols)}, &y);
  nb::gil_scoped_release release;
  kernels::cpu::dequant_fp8_blocks(codes.data(), scales.data(), rows, cols, block_rows, block_cols,
                                   y);
  return out;
}

OutArray dequant_fp4_rows_np(const AnyIn2& packed, const U8In2& scales) {
  DSV41RT_CHECK(packed.dtype() == nb::dtype<uint8_t>() || packed.dtype() == nb::dtype<int8_t>(),
                "dequant_fp4_rows: packed must be an int8 or uint8 array");
  const int64_t rows = static_cast<int64_t>(packed.shape(0));
  const int64_t cols = 2 * static_cast<int64_t>(packed.shape(1));
  const int64_t sc = (cols + 31) / 32;
  DSV41RT_CHECK(
      static_cast<int64_t>(scales.shape(0)) == rows && static_cast<int64_t>(scales.shape(1)) == sc,
      "dequant_fp4_rows: scales have shape [", scales.shape(0), ", ", scales.shape(1),
      "], expected [", rows, ", ", sc, "] for ", cols, " columns");
  float* y = nullptr;
  OutArray out = new_array<float>({size_t(rows), size_t(cols)}, &y);
  const auto* p = static_cast<const uint8_t*>(packed.data());
  nb::gil_scoped_release release;
  kernels::cpu::dequant_fp4_rows(p, scales.data(), rows, cols, y);
  return out;
}

}  // namespace

void register_ops_quant(nb::module_& ops) {
  namespace k = kernels::cpu;
  ops.def(
      "fp8_window_qdq",
      [](const F32In& x) { return qdq_np(x, k::fp8_window_qdq, "fp8_window_qdq"); }, nb::arg("x"),
      "Window-KV cache QDQ: FP8 E4M3, blocks of 32, UE8M0 scales. x float32 [..., dim].");
  ops.def(
      "nvfp4_qdq", [](const F32In& x) { return qdq_np(x, k::nvfp4_qdq, "nvfp4_qdq"); },
      nb::arg("x"),
      "Compressed-KV cache QDQ: E2M1, blocks of 16, E4M3 scales. x float32 [..., dim].");
  ops.def(
      "mxfp4_qdq", [](const F32In& x) { return qdq_np(x, k::mxfp4_qdq, "mxfp4_qdq"); },
      nb::arg("x"), "Indexer cache QDQ: E2M1, blocks of 32, UE8M0 scales. x float32 [..., dim].");
  ops.def(
      "v4_row_qdq", [](const F32In& x) { return qdq_np(x, k::v4_row_qdq, "v4_row_qdq"); },
      nb::arg("x"),
      "DeepSeek-V4 cache-row QDQ (584-byte rows): FP8 E4M3 channels 0..447 in blocks of 64 with "
      "UE8M0 scales, BF16 channels 448..511. x float32 [..., 512].");
  ops.def(
      "fp8_window_pack",
      [](const F32In& x) {
        return pack_np(x, k::fp8_window_pack, kernels::fp8_window_row_bytes, "fp8_window_pack");
      },
      nb::arg("x"), "float32 [..., dim] -> uint8 [..., dim + dim/32].");
  ops.def(
      "fp8_window_unpack",
      [](const U8In& b) {
        return unpack_np(b, k::fp8_window_unpack, kernels::fp8_window_row_bytes, 32, 33,
                         "fp8_window_unpack");
      },
      nb::arg("packed"), "uint8 [..., dim + dim/32] -> float32 [..., dim].");
  ops.def(
      "nvfp4_pack",
      [](const F32In& x) {
        return pack_np(x, k::nvfp4_pack, kernels::nvfp4_row_bytes, "nvfp4_pack");
      },
      nb::arg("x"), "float32 [..., dim] -> uint8 [..., dim/2 + dim/16].");
  ops.def(
      "nvfp4_unpack",
      [](const U8In& b) {
        return unpack_np(b, k::nvfp4_unpack, kernels::nvfp4_row_bytes, 16, 9, "nvfp4_unpack");
      },
      nb::arg("packed"), "uint8 [..., dim/2 + dim/16] -> float32 [..., dim].");
  ops.def(
      "mxfp4_pack",
      [](const F32In& x) {
        return pack_np(x, k::mxfp4_pack, kernels::mxfp4_row_bytes, "mxfp4_pack");
      },
      nb::arg("x"), "float32 [..., dim] -> uint8 [..., dim/2 + dim/32].");
  ops.def(
      "mxfp4_unpack",
      [](const U8In& b) {
        return unpack_np(b, k::mxfp4_unpack, kernels::mxfp4_row_bytes, 32, 17, "mxfp4_unpack");
      },
      nb::arg("packed"), "uint8 [..., dim/2 + dim/32] -> float32 [..., dim].");
  ops.def(
      "dequant_fp8_blocks",
      [](const U8In2& codes, const U8In2& scales, int64_t br, int64_t bc) {
        return dequant_fp8_blocks_np(codes, scales, br, bc);
      },
      nb::arg("codes"), nb::arg("scales"), nb::arg("block_rows"), nb::arg("block_cols"),
      "E4M3 codes uint8 [rows, cols] * UE8M0 scales uint8 [ceil(rows/br), ceil(cols/bc)] "
      "-> float32 [rows, cols].");
  ops.def(
      "dequant_fp4_rows",
      [](const AnyIn2& packed, const U8In2& scales) { return dequant_fp4_rows_np(packed, scales); },
      nb::arg("packed"), nb::arg("scales"),
      "Packed E2M1 int8/uint8 [rows, cols/2] * UE8M0 scales uint8 [rows, ceil(cols/32)] "
      "-> float32 [rows, cols].");
}

}  // namespace dsv41rt::bindings
