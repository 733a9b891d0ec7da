// dsv41rt._core.ops bindings of the norm ops: RMSNorm, RoPE (+ YaRN table) and mHC
// (hc_mix / hc_collapse / hc_expand). numpy float32 in, new numpy float32 arrays out; compute runs
// with the GIL released on borrowed buffers.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/tuple.h>

#include <cstring>
#include <optional>
#include <tuple>
#include <vector>

#include "core/status.h"
#include "kernels/mhc.h"
#include "kernels/rms_norm.h"
#include "kernels/rope.h"

namespace nb = nanobind;

namespace dsv41rt::bindings {
namespace {

using F32 = nb::ndarray<const float, nb::c_contig, nb::device::cpu>;
using I64 = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using NpF32 = nb::ndarray<nb::numpy, float>;

NpF32 new_array(std::initializer_list<size_t> shape, float** data) {
  size_t count = 1;
  for (size_t d : shape) count *= d;
  auto* p = new float[count > 0 ? count : 1];
  nb::capsule owner(p, [](void* q) noexcept { delete[] static_cast<float*>(q); });
  *data = p;
  return NpF32(p, shape, owner);
}

NpF32 rms_norm_np(F32 x, F32 weight, float eps) {
  DSV41RT_CHECK(x.ndim() >= 1, "rms_norm: x must have at least one dimension");
  DSV41RT_CHECK(weight.ndim() == 1, "rms_norm: weight must be 1-D");
  const int64_t dim = x.shape(x.ndim() - 1);
  DSV41RT_CHECK(int64_t(weight.shape(0)) == dim, "rms_norm: weight has ", weight.shape(0),
                " entries, x rows have ", dim);
  const int64_t rows = dim > 0 ? int64_t(x.size()) / dim : 0;
  std::vector<size_t> shape(x.ndim());
  for (size_t i = 0; i < x.ndim(); ++i) shape[i] = x.shape(i);
  auto* y = new float[x.size() > 0 ? x.size() : 1];
  nb::capsule owner(y, [](void* q) noexcept { delete[] static_cast<float*>(q); });
  {
    nb::gil_scoped_release release;
    kernels::cpu::rms_norm(x.data(), weight.data(), rows, dim, eps, y);
  }
  return NpF32(y, x.ndim(), shape.data(), owner);
}

NpF32 rope_inv_freq_np(int64_t rope_dim, double base, std::optional<nb::dict> yarn) {
  kernels::YarnParams p;
  const kernels::YarnParams* pp = nullptr;
  if (yarn.has_value()) {
    const nb::dict& d = *yarn;
    auto get = [&](const char* key, double dflt) {
      return d.contains(key) ? nb::cast<double>(d[key]) : dflt;
    };
    p.factor = get("factor", 1.0);
    p.original_max_position = d.contains("original_max_position_embeddings")
                                  ? nb::cast<int64_t>(d["original_max_position_embeddings"])
                                  : 0;
    p.beta_fast = get("beta_fast", 32.0);
    p.beta_slow = get("beta_slow", 1.0);
    pp = &p;
  }
  const std::vector<float> f = kernels::cpu::rope_inv_freq(rope_dim, base, pp);
  float* out = nullptr;
  NpF32 arr = new_array({f.size()}, &out);
  std::memcpy(out, f.data(), f.size() * sizeof(float));
  return arr;
}

NpF32 apply_rope_np(F32 x, I64 positions, F32 inv_freq, bool inverse) {
  DSV41RT_CHECK(x.ndim() == 3, "apply_rope: x must be [rows, heads, head_dim]");
  DSV41RT_CHECK(inv_freq.ndim() == 1, "apply_rope: inv_freq must be 1-D");
  const int64_t rows = x.shape(0), heads = x.shape(1), hd = x.shape(2);
  const int64_t rope_dim = 2 * int64_t(inv_freq.shape(0));
  DSV41RT_CHECK(int64_t(positions.shape(0)) == rows, "apply_rope: ", positions.shape(0),
                " positions for ", rows, " rows");
  float* y = nullptr;
  NpF32 arr = new_array({size_t(rows), size_t(heads), size_t(hd)}, &y);
  {
    nb::gil_scoped_release release;
    std::memcpy(y, x.data(), x.size() * sizeof(float));
    kernels::cpu::apply_rope(y, rows, heads, hd, rope_dim, positions.data(), inv_freq.data(),
                             inverse);
  }
  return arr;
}

std::tuple<NpF32, NpF32, NpF32> hc_mix_np(F32 X, F32 fn, F32 base, F32 scale, float rms_eps,
                                          float hc_eps, int iters) {
  DSV41RT_CHECK(X.ndim() == 3, "hc_mix: X must be [S, n, H]");
  const int64_t S = X.shape(0), n = X.shape(1), H = X.shape(2), W = (2 + n) * n;
  DSV41RT_CHECK(fn.ndim() == 2 && int64_t(fn.shape(0)) == W && int64_t(fn.shape(1)) == n * H,
                "hc_mix: fn must be [", W, ", ", n * H, "]");
  DSV41RT_CHECK(base.ndim() == 1 && int64_t(base.shape(0)) == W, "hc_mix: base must be [", W, "]");
  DSV41RT_CHECK(scale.ndim() == 1 && scale.shape(0) == 3, "hc_mix: scale must be [3]");
  float *pre = nullptr, *post = nullptr, *comb = nullptr;
  NpF32 a = new_array({size_t(S), size_t(n)}, &pre);
  NpF32 b = new_array({size_t(S), size_t(n)}, &post);
  NpF32 c = new_array({size_t(S), size_t(n), size_t(n)}, &comb);
  {
    nb::gil_scoped_release release;
    kernels::cpu::hc_mix(X.data(), fn.data(), base.data(), scale.data(), S, n, H, rms_eps, hc_eps,
                         iters, pre, post, comb);
  }
  return {a, b, c};
}

NpF32 hc_collapse_np(F32 X, F32 w) {
  DSV41RT_CHECK(X.ndim() == 3, "hc_collapse: X must be [S, n, H]");
  const int64_t S = X.shape(0), n = X.shape(1), H = X.shape(2);
  DSV41RT_CHECK(w.ndim() == 2 && int64_t(w.shape(0)) == S && int64_t(w.shape(1)) == n,
                "hc_collapse: w must be [", S, ", ", n, "]");
  float* u = nullptr;
  NpF32 arr = new_array({size_t(S), size_t(H)}, &u);
  {
    nb::gil_scoped_release release;
    kernels::cpu::hc_collapse(X.data(), w.data(), S, n, H, u);
  }
  return arr;
}

NpF32 hc_expand_np(F32 X, F32 y, F32 post, F32 comb) {
  DSV41RT_CHECK(X.ndim() == 3, "hc_expand: X must be [S, n, H]");
  const int64_t S = X.shape(0), n = X.shape(1), H = X.shape(2);
  DSV41RT_CHECK(y.ndim() == 2 && int64_t(y.shape(0)) == S && int64_t(y.shape(1)) == H,
                "hc_expand: y must be [", S, ", ", H, "]");
  DSV41RT_CHECK(post.ndim() == 2 && int64_t(post.shape(0)) == S && int64_t(post.shape(1)) == n,
                "hc_expand: post must be [", S, ", ", n, "]");
  DSV41RT_CHECK(comb.ndim() == 3 && int64_t(comb.shape(0)) == S && int64_t(comb.shape(1)) == n &&
                    int64_t(comb.shape(2)) == n,
                "hc_expand: comb must be [", S, ", ", n, ", ", n, "]");
  float* out = nullptr;
  NpF32 arr = new_array({size_t(S), size_t(n), size_t(H)}, &out);
  {
    nb::gil_scoped_release release;
    kernels::cpu::hc_expand(X.data(), y.data(), post.data(), comb.data(), S, n, H, out);
  }
  return arr;
}

}  // namespace

void register_ops_norm(nb::module_& ops) {
  ops.def("rms_norm", &rms_norm_np, nb::arg("x"), nb::arg("weight"), nb::arg("eps"),
          "y = weight * x * rsqrt(mean(x^2, -1) + eps) over the last dim (FP32)");
  ops.def("rope_inv_freq", &rope_inv_freq_np, nb::arg("rope_dim"), nb::arg("base"),
          nb::arg("yarn").none() = nb::none(),
          "FP32 RoPE frequency table [rope_dim/2]; yarn = HF rope_scaling dict (factor, "
          "original_max_position_embeddings, beta_fast, beta_slow) or None");
  ops.def("apply_rope", &apply_rope_np, nb::arg("x"), nb::arg("positions"), nb::arg("inv_freq"),
          nb::arg("inverse") = false,
          "Rotate the last 2*len(inv_freq) channels of x [rows, heads, head_dim] (interleaved "
          "pairs) by positions[r] * inv_freq; returns a new array");
  ops.def("hc_mix", &hc_mix_np, nb::arg("X"), nb::arg("fn"), nb::arg("base"), nb::arg("scale"),
          nb::arg("rms_eps"), nb::arg("hc_eps"), nb::arg("iters"),
          "mHC mixer: X [S, n, H] -> (pre [S, n], post [S, n], comb [S, n(in), n(out)])");
  ops.def("hc_collapse", &hc_collapse_np, nb::arg("X"), nb::arg("w"),
          "u[S, H] = sum_i w[:, i] * X[:, i]");
  ops.def("hc_expand", &hc_expand_np, nb::arg("X"), nb::arg("y"), nb::arg("post"), nb::arg("comb"),
          "out[S, o, H] = post[:, o] * y + sum_i comb[:, i, o] * X[:, i]");
}

}  // namespace dsv41rt::bindings
