// dsv41rt._core.cuda_ops bindings of the quant, RoPE, mHC and linear CUDA kernels, with the same
// Python signatures as their CPU references in dsv41rt._core.ops (ops_quant_bindings.cc,
// ops_norm_bindings.cc, ops_bindings.cc), so the tests call both the same way. grouped_linear has
// no CPU binding: cuda_ops.grouped_linear(x [m, g, k_g], w [g, n_g, k_g]) -> [m, g, n_g].
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/tuple.h>

#include <cstring>
#include <optional>
#include <tuple>
#include <vector>

#include "runtime/status.h"
#ifdef DSV41RT_WITH_CUDA
#include "kernels/cuda/testing/quant_test_entry.h"
#include "kernels/cuda/testing/rope_mhc_test_entry.h"
#include "kernels/quant.h"
#endif

namespace nb = nanobind;

namespace dsv41rt::bindings {

#ifdef DSV41RT_WITH_CUDA
namespace {

namespace entry = kernels::cuda::testing;

using F32In = nb::ndarray<const float, nb::c_contig, nb::device::cpu>;
using U8In = nb::ndarray<const uint8_t, nb::c_contig, nb::device::cpu>;
using U8In2 = nb::ndarray<const uint8_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using AnyIn2 = nb::ndarray<nb::ro, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using I64In = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
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

// ---- quant ----

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
  shape.back() = static_cast<size_t>(row_bytes(dim));  // dim itself is checked by the entry
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
  entry::dequant_fp8_blocks(codes.data(), scales.data(), rows, cols, block_rows, block_cols, y);
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
  entry::dequant_fp4_rows(p, scales.data(), rows, cols, y);
  return out;
}

// ---- RoPE, mHC, linear ----

OutArray apply_rope_np(const F32In& x, const I64In& positions, const F32In& inv_freq,
                       bool inverse) {
  DSV41RT_CHECK(x.ndim() == 3, "apply_rope: x must be [rows, heads, head_dim]");
  DSV41RT_CHECK(inv_freq.ndim() == 1, "apply_rope: inv_freq must be 1-D");
  const int64_t rows = x.shape(0), heads = x.shape(1), hd = x.shape(2);
  const int64_t rope_dim = 2 * int64_t(inv_freq.shape(0));
  DSV41RT_CHECK(int64_t(positions.shape(0)) == rows, "apply_rope: ", positions.shape(0),
                " positions for ", rows, " rows");
  DSV41RT_CHECK(heads > 0 && hd > 0 && rope_dim > 0 && rope_dim <= hd,
                "apply_rope: bad shape heads=", heads, " head_dim=", hd, " rope_dim=", rope_dim);
  float* y = nullptr;
  OutArray out = new_array<float>({size_t(rows), size_t(heads), size_t(hd)}, &y);
  nb::gil_scoped_release release;
  entry::apply_rope(x.data(), rows, heads, hd, rope_dim, positions.data(), inv_freq.data(), inverse,
                    y);
  return out;
}

std::tuple<OutArray, OutArray, OutArray> hc_mix_np(const F32In& X, const F32In& fn,
                                                   const F32In& base, const F32In& scale,
                                                   float rms_eps, float hc_eps, int iters) {
  DSV41RT_CHECK(X.ndim() == 3, "hc_mix: X must be [S, n, H]");
  const int64_t S = X.shape(0), n = X.shape(1), H = X.shape(2), W = (2 + n) * n;
  DSV41RT_CHECK(n > 0 && H > 0, "hc_mix: bad shape n=", n, " H=", H);
  DSV41RT_CHECK(fn.ndim() == 2 && int64_t(fn.shape(0)) == W && int64_t(fn.shape(1)) == n * H,
                "hc_mix: fn must be [", W, ", ", n * H, "]");
  DSV41RT_CHECK(base.ndim() == 1 && int64_t(base.shape(0)) == W, "hc_mix: base must be [", W, "]");
  DSV41RT_CHECK(scale.ndim() == 1 && scale.shape(0) == 3, "hc_mix: scale must be [3]");
  DSV41RT_CHECK(iters >= 1, "hc_mix: iters must be >= 1, got ", iters);
  float *pre = nullptr, *post = nullptr, *comb = nullptr;
  OutArray a = new_array<float>({size_t(S), size_t(n)}, &pre);
  OutArray b = new_array<float>({size_t(S), size_t(n)}, &post);
  OutArray c = new_array<float>({size_t(S), size_t(n), size_t(n)}, &comb);
  {
    nb::gil_scoped_release release;
    entry::hc_mix(X.data(), fn.data(), base.data(), scale.data(), S, n, H, rms_eps, hc_eps, iters,
                  pre, post, comb);
  }
  return {a, b, c};
}

OutArray hc_collapse_np(const F32In& X, const F32In& w) {
  DSV41RT_CHECK(X.ndim() == 3, "hc_collapse: X must be [S, n, H]");
  const int64_t S = X.shape(0), n = X.shape(1), H = X.shape(2);
  DSV41RT_CHECK(n > 0 && H > 0, "hc_collapse: bad shape n=", n, " H=", H);
  DSV41RT_CHECK(w.ndim() == 2 && int64_t(w.shape(0)) == S && int64_t(w.shape(1)) == n,
                "hc_collapse: w must be [", S, ", ", n, "]");
  float* u = nullptr;
  OutArray out = new_array<float>({size_t(S), size_t(H)}, &u);
  nb::gil_scoped_release release;
  entry::hc_collapse(X.data(), w.data(), S, n, H, u);
  return out;
}

OutArray hc_expand_np(const F32In& X, const F32In& y, const F32In& post, const F32In& comb) {
  DSV41RT_CHECK(X.ndim() == 3, "hc_expand: X must be [S, n, H]");
  const int64_t S = X.shape(0), n = X.shape(1), H = X.shape(2);
  DSV41RT_CHECK(n > 0 && H > 0, "hc_expand: bad shape n=", n, " H=", H);
  DSV41RT_CHECK(y.ndim() == 2 && int64_t(y.shape(0)) == S && int64_t(y.shape(1)) == H,
                "hc_expand: y must be [", S, ", ", H, "]");
  DSV41RT_CHECK(post.ndim() == 2 && int64_t(post.shape(0)) == S && int64_t(post.shape(1)) == n,
                "hc_expand: post must be [", S, ", ", n, "]");
  DSV41RT_CHECK(comb.ndim() == 3 && int64_t(comb.shape(0)) == S && int64_t(comb.shape(1)) == n &&
                    int64_t(comb.shape(2)) == n,
                "hc_expand: comb must be [", S, ", ", n, ", ", n, "]");
  float* o = nullptr;
  OutArray out = new_array<float>({size_t(S), size_t(n), size_t(H)}, &o);
  nb::gil_scoped_release release;
  entry::hc_expand(X.data(), y.data(), post.data(), comb.data(), S, n, H, o);
  return out;
}

OutArray linear_np(const F32In& x, const F32In& w, std::optional<F32In> y0) {
  DSV41RT_CHECK(x.ndim() == 2 && w.ndim() == 2, "linear: x and w must be 2-D");
  DSV41RT_CHECK(x.shape(1) == w.shape(1), "linear: x has ", x.shape(1), " columns, w has ",
                w.shape(1));
  const int64_t m = x.shape(0), k = x.shape(1), n = w.shape(0);
  DSV41RT_CHECK(
      !y0 || (y0->ndim() == 2 && int64_t(y0->shape(0)) == m && int64_t(y0->shape(1)) == n),
      "linear: y must be [", m, ", ", n, "]");
  float* y = nullptr;
  OutArray out = new_array<float>({size_t(m), size_t(n)}, &y);
  nb::gil_scoped_release release;
  if (y0) std::memcpy(y, y0->data(), size_t(m * n) * sizeof(float));
  entry::linear(x.data(), w.data(), m, k, n, y, y0.has_value());
  return out;
}

OutArray grouped_linear_np(const F32In& x, const F32In& w) {
  DSV41RT_CHECK(x.ndim() == 3 && w.ndim() == 3,
                "grouped_linear: x must be [m, g, k_g] and w [g, n_g, k_g]");
  const int64_t m = x.shape(0), g = x.shape(1), kg = x.shape(2), ng = w.shape(1);
  DSV41RT_CHECK(int64_t(w.shape(0)) == g && int64_t(w.shape(2)) == kg, "grouped_linear: w is [",
                w.shape(0), ", ", w.shape(1), ", ", w.shape(2), "], x is [", m, ", ", g, ", ", kg,
                "]");
  float* y = nullptr;
  OutArray out = new_array<float>({size_t(m), size_t(g), size_t(ng)}, &y);
  nb::gil_scoped_release release;
  entry::grouped_linear(x.data(), w.data(), m, g, kg, ng, y);
  return out;
}

}  // namespace

void register_cuda_ops_quant(nb::module_& ops) {
  namespace k = kernels::cpu;
  // Quant (signatures of ops_quant_bindings.cc).
  ops.def(
      "fp8_window_qdq",
      [](const F32In& x) { return qdq_np(x, entry::fp8_window_qdq, "fp8_window_qdq"); },
      nb::arg("x"));
  ops.def(
      "nvfp4_qdq", [](const F32In& x) { return qdq_np(x, entry::nvfp4_qdq, "nvfp4_qdq"); },
      nb::arg("x"));
  ops.def(
      "mxfp4_qdq", [](const F32In& x) { return qdq_np(x, entry::mxfp4_qdq, "mxfp4_qdq"); },
      nb::arg("x"));
  ops.def(
      "fp8_window_pack",
      [](const F32In& x) {
        return pack_np(x, entry::fp8_window_pack, k::fp8_window_row_bytes, "fp8_window_pack");
      },
      nb::arg("x"));
  ops.def(
      "fp8_window_unpack",
      [](const U8In& b) {
        return unpack_np(b, entry::fp8_window_unpack, k::fp8_window_row_bytes, 32, 33,
                         "fp8_window_unpack");
      },
      nb::arg("packed"));
  ops.def(
      "nvfp4_pack",
      [](const F32In& x) {
        return pack_np(x, entry::nvfp4_pack, k::nvfp4_row_bytes, "nvfp4_pack");
      },
      nb::arg("x"));
  ops.def(
      "nvfp4_unpack",
      [](const U8In& b) {
        return unpack_np(b, entry::nvfp4_unpack, k::nvfp4_row_bytes, 16, 9, "nvfp4_unpack");
      },
      nb::arg("packed"));
  ops.def(
      "mxfp4_pack",
      [](const F32In& x) {
        return pack_np(x, entry::mxfp4_pack, k::mxfp4_row_bytes, "mxfp4_pack");
      },
      nb::arg("x"));
  ops.def(
      "mxfp4_unpack",
      [](const U8In& b) {
        return unpack_np(b, entry::mxfp4_unpack, k::mxfp4_row_bytes, 32, 17, "mxfp4_unpack");
      },
      nb::arg("packed"));
  ops.def("dequant_fp8_blocks", &dequant_fp8_blocks_np, nb::arg("codes"), nb::arg("scales"),
          nb::arg("block_rows"), nb::arg("block_cols"));
  ops.def("dequant_fp4_rows", &dequant_fp4_rows_np, nb::arg("packed"), nb::arg("scales"));
  // RoPE and mHC (signatures of ops_norm_bindings.cc).
  ops.def("apply_rope", &apply_rope_np, nb::arg("x"), nb::arg("positions"), nb::arg("inv_freq"),
          nb::arg("inverse") = false);
  ops.def("hc_mix", &hc_mix_np, nb::arg("X"), nb::arg("fn"), nb::arg("base"), nb::arg("scale"),
          nb::arg("rms_eps"), nb::arg("hc_eps"), nb::arg("iters"));
  ops.def("hc_collapse", &hc_collapse_np, nb::arg("X"), nb::arg("w"));
  ops.def("hc_expand", &hc_expand_np, nb::arg("X"), nb::arg("y"), nb::arg("post"), nb::arg("comb"));
  // Linear (ops_bindings.cc; y = optional initial values to accumulate into, default overwrite).
  ops.def("linear", &linear_np, nb::arg("x"), nb::arg("w"), nb::arg("y").none() = nb::none(),
          "y = x @ w.T (FP32); with y given, returns y + x @ w.T (the accumulate mode)");
  ops.def("grouped_linear", &grouped_linear_np, nb::arg("x"), nb::arg("w"),
          "x [m, g, k_g], w [g, n_g, k_g] -> [m, g, n_g] (per group x_g @ w_g.T)");
}
#else
void register_cuda_ops_quant(nb::module_&) {}
#endif

}  // namespace dsv41rt::bindings
