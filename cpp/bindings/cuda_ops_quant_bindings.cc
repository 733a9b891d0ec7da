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

#include "bindings/quant_binders.h"
#include "core/status.h"
#ifdef DSV41RT_WITH_CUDA
#include "kernels/cuda/testing/quant_test_entry.h"
#include "kernels/cuda/testing/rope_mhc_test_entry.h"
#endif

namespace nb = nanobind;

namespace dsv41rt::bindings {

#ifdef DSV41RT_WITH_CUDA
namespace {

namespace entry = kernels::cuda::testing;

using F32In = nb::ndarray<const float, nb::c_contig, nb::device::cpu>;
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
  // Quant: the CPU module's wrappers and shape checks, the CUDA kernels behind them.
  register_quant_family(
      ops,
      QuantFns{entry::fp8_window_qdq, entry::nvfp4_qdq, entry::mxfp4_qdq, entry::fp8_window_pack,
               entry::nvfp4_pack, entry::mxfp4_pack, entry::fp8_window_unpack, entry::nvfp4_unpack,
               entry::mxfp4_unpack, entry::dequant_fp8_blocks, entry::dequant_fp4_rows});
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
