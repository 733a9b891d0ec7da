// dsv41rt._core.ops bindings of the MoE and Engram ops (numpy in / out, FP32, GIL released).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>

#include <algorithm>
#include <optional>
#include <vector>

#include "bindings/numpy_io.h"
#include "core/status.h"
#include "kernels/engram.h"
#include "kernels/moe.h"

namespace nb = nanobind;

namespace dsv41rt::bindings {
namespace {

nb::tuple moe_route_np(In<float, 2> x, In<float, 2> gate_w, std::optional<In<float, 1>> bias,
                       int64_t k, float routed_scaling_factor, bool normalize) {
  const int64_t S = x.shape(0), H = x.shape(1), E = gate_w.shape(0);
  DSV41RT_CHECK(gate_w.shape(1) == size_t(H), "moe_route: gate_w has ", gate_w.shape(1),
                " columns, x has ", H);
  DSV41RT_CHECK(!bias || bias->shape(0) == size_t(E), "moe_route: bias length ", bias->shape(0),
                " != E = ", E);
  DSV41RT_CHECK(k >= 1 && k <= E, "moe_route: k=", k, " E=", E);
  auto idx = new_array<int32_t>({size_t(S), size_t(k)});
  auto w = new_array<float>({size_t(S), size_t(k)});
  {
    nb::gil_scoped_release release;
    kernels::cpu::moe_route(x.data(), gate_w.data(), bias ? bias->data() : nullptr, S, H, E, k,
                            routed_scaling_factor, idx.data(), w.data(), normalize);
  }
  return nb::make_tuple(idx, w);
}

nb::tuple moe_route_hash_np(In<float, 2> x, In<float, 2> gate_w, In<int32_t, 2> tid2eid,
                            In<int64_t, 1> token_ids, float routed_scaling_factor, bool normalize) {
  const int64_t S = x.shape(0), H = x.shape(1), E = gate_w.shape(0), k = tid2eid.shape(1);
  DSV41RT_CHECK(gate_w.shape(1) == size_t(H), "moe_route_hash: gate_w / x width mismatch");
  DSV41RT_CHECK(token_ids.shape(0) == size_t(S), "moe_route_hash: token_ids length ",
                token_ids.shape(0), " != S = ", S);
  DSV41RT_CHECK(k >= 1 && k <= E, "moe_route_hash: k=", k, " E=", E);
  auto idx = new_array<int32_t>({size_t(S), size_t(k)});
  auto w = new_array<float>({size_t(S), size_t(k)});
  {
    nb::gil_scoped_release release;
    kernels::cpu::moe_route_hash(x.data(), gate_w.data(), tid2eid.data(), token_ids.data(), S, H, E,
                                 k, int64_t(tid2eid.shape(0)), routed_scaling_factor, idx.data(),
                                 w.data(), normalize);
  }
  return nb::make_tuple(idx, w);
}

Out<float> swiglu_expert_np(In<float, 2> x, In<float, 2> w1, In<float, 2> w3, In<float, 2> w2,
                            std::optional<In<float, 1>> row_scale, float limit) {
  const int64_t m = x.shape(0), H = x.shape(1), I = w1.shape(0);
  DSV41RT_CHECK(w1.shape(1) == size_t(H) && w3.shape(0) == size_t(I) && w3.shape(1) == size_t(H) &&
                    w2.shape(0) == size_t(H) && w2.shape(1) == size_t(I),
                "swiglu_expert: expected w1, w3 [", I, ", ", H, "] and w2 [", H, ", ", I, "]");
  DSV41RT_CHECK(!row_scale || row_scale->shape(0) == size_t(m), "swiglu_expert: row_scale length");
  auto y = new_array<float>({size_t(m), size_t(H)});
  {
    nb::gil_scoped_release release;
    kernels::cpu::swiglu_expert(x.data(), w1.data(), w3.data(), w2.data(),
                                row_scale ? row_scale->data() : nullptr, m, H, I, limit, y.data());
  }
  return y;
}

Out<float> moe_forward_np(In<float, 2> x, In<int32_t, 2> idx, In<float, 2> weight, In<float, 3> w1,
                          In<float, 3> w3, In<float, 3> w2, std::optional<In<float, 2>> sw1,
                          std::optional<In<float, 2>> sw3, std::optional<In<float, 2>> sw2,
                          float limit) {
  const int64_t S = x.shape(0), H = x.shape(1), k = idx.shape(1);
  const int64_t E = w1.shape(0), I = w1.shape(1);
  DSV41RT_CHECK(
      idx.shape(0) == size_t(S) && weight.shape(0) == size_t(S) && weight.shape(1) == size_t(k),
      "moe_forward: idx / weight must be [S, k]");
  DSV41RT_CHECK(w1.shape(2) == size_t(H) && w3.shape(0) == size_t(E) && w3.shape(1) == size_t(I) &&
                    w3.shape(2) == size_t(H) && w2.shape(0) == size_t(E) &&
                    w2.shape(1) == size_t(H) && w2.shape(2) == size_t(I),
                "moe_forward: expected w1, w3 [E, I, H] and w2 [E, H, I]");
  const bool has_shared = sw1.has_value();
  DSV41RT_CHECK(has_shared == sw3.has_value() && has_shared == sw2.has_value(),
                "moe_forward: give all or none of shared_w1, shared_w3, shared_w2");
  int64_t Is = 0;
  kernels::SwigluWeights shared;
  if (has_shared) {
    Is = sw1->shape(0);
    DSV41RT_CHECK(sw1->shape(1) == size_t(H) && sw3->shape(0) == size_t(Is) &&
                      sw3->shape(1) == size_t(H) && sw2->shape(0) == size_t(H) &&
                      sw2->shape(1) == size_t(Is),
                  "moe_forward: expected shared w1, w3 [Is, H] and w2 [H, Is]");
    shared = {sw1->data(), sw3->data(), sw2->data()};
  }
  std::vector<kernels::SwigluWeights> experts(E);
  for (int64_t e = 0; e < E; ++e) {
    experts[e] = {w1.data() + e * I * H, w3.data() + e * I * H, w2.data() + e * H * I};
  }
  auto y = new_array<float>({size_t(S), size_t(H)});
  {
    nb::gil_scoped_release release;
    kernels::cpu::moe_forward(x.data(), idx.data(), weight.data(), S, H, k, E, I, experts.data(),
                              has_shared ? &shared : nullptr, Is, limit, y.data());
  }
  return y;
}

Out<int64_t> engram_hash_rows_np(In<int64_t, 1> compressed_ids, int64_t n_heads,
                                 In<int64_t, 1> multipliers, In<int64_t, 1> primes,
                                 In<int64_t, 1> offsets, int64_t pad_id) {
  const int64_t max_ngram = multipliers.shape(0);
  DSV41RT_CHECK(max_ngram >= 2, "engram_hash_rows: need >= 2 multipliers");
  const int64_t cols = (max_ngram - 1) * n_heads;
  DSV41RT_CHECK(n_heads >= 1 && primes.shape(0) == size_t(cols) && offsets.shape(0) == size_t(cols),
                "engram_hash_rows: primes / offsets must have (max_ngram - 1) * n_heads = ", cols,
                " entries");
  const int64_t total = compressed_ids.shape(0);
  DSV41RT_CHECK(total >= max_ngram - 1, "engram_hash_rows: compressed_ids needs the ",
                max_ngram - 1, " history slots first");
  const int64_t S = total - (max_ngram - 1);
  auto rows = new_array<int64_t>({size_t(S), size_t(cols)});
  {
    nb::gil_scoped_release release;
    kernels::cpu::engram_hash_rows(compressed_ids.data(), S, max_ngram, n_heads, multipliers.data(),
                                   primes.data(), offsets.data(), pad_id, rows.data());
  }
  return rows;
}

Out<float> engram_forward_np(In<float, 3> X, In<float, 2> emb, In<float, 2> wkv,
                             In<float, 2> q_weight, In<float, 2> k_weight,
                             std::optional<In<bool, 1>> token_mask, float eps) {
  const int64_t S = X.shape(0), n = X.shape(1), H = X.shape(2), D = emb.shape(1);
  DSV41RT_CHECK(emb.shape(0) == size_t(S), "engram_forward: emb rows ", emb.shape(0), " != S ", S);
  DSV41RT_CHECK(wkv.shape(0) == size_t((n + 1) * H) && wkv.shape(1) == size_t(D),
                "engram_forward: wkv must be [(n+1)H, D] = [", (n + 1) * H, ", ", D, "]");
  DSV41RT_CHECK(q_weight.shape(0) == size_t(n) && q_weight.shape(1) == size_t(H) &&
                    k_weight.shape(0) == size_t(n) && k_weight.shape(1) == size_t(H),
                "engram_forward: q_weight / k_weight must be [n, H]");
  DSV41RT_CHECK(!token_mask || token_mask->shape(0) == size_t(S), "engram_forward: token_mask");
  static_assert(sizeof(bool) == sizeof(uint8_t));
  auto y = new_array<float>({size_t(S), size_t(n), size_t(H)});
  {
    nb::gil_scoped_release release;
    std::copy(X.data(), X.data() + S * n * H, y.data());
    kernels::cpu::engram_forward(
        y.data(), emb.data(), wkv.data(), q_weight.data(), k_weight.data(),
        token_mask ? reinterpret_cast<const uint8_t*>(token_mask->data()) : nullptr, S, n, H, D,
        eps);
  }
  return y;
}

}  // namespace

void register_ops_moe(nb::module_& ops) {
  ops.def("moe_route", &moe_route_np, nb::arg("x"), nb::arg("gate_w"), nb::arg("bias").none(),
          nb::arg("k"), nb::arg("routed_scaling_factor"), nb::arg("normalize") = true,
          "Score routing (sqrtsoftplus, top-k of s + bias, weights from unbiased s): returns "
          "(idx int32 [S, k], weight float32 [S, k]).");
  ops.def("moe_route_hash", &moe_route_hash_np, nb::arg("x"), nb::arg("gate_w"), nb::arg("tid2eid"),
          nb::arg("token_ids"), nb::arg("routed_scaling_factor"), nb::arg("normalize") = true,
          "Hash routing (V4): returns (idx, weight).");
  ops.def("swiglu_expert", &swiglu_expert_np, nb::arg("x"), nb::arg("w1"), nb::arg("w3"),
          nb::arg("w2"), nb::arg("row_scale").none(), nb::arg("limit"),
          "Clamped SwiGLU expert; row_scale multiplies h before w2.");
  ops.def("moe_forward", &moe_forward_np, nb::arg("x"), nb::arg("idx"), nb::arg("weight"),
          nb::arg("w1"), nb::arg("w3"), nb::arg("w2"), nb::arg("shared_w1").none(),
          nb::arg("shared_w3").none(), nb::arg("shared_w2").none(), nb::arg("limit"),
          "Routed experts (stacked w1, w3 [E, I, H], w2 [E, H, I]) + shared expert.");
  ops.def("engram_hash_rows", &engram_hash_rows_np, nb::arg("compressed_ids"), nb::arg("n_heads"),
          nb::arg("multipliers"), nb::arg("primes"), nb::arg("offsets"), nb::arg("pad_id"),
          "Engram row ids [S, (max_ngram-1)*n_heads] of one layer; compressed_ids = "
          "max_ngram-1 history slots then S positions, negative = blocking.");
  ops.def("engram_forward", &engram_forward_np, nb::arg("X"), nb::arg("emb"), nb::arg("wkv"),
          nb::arg("q_weight"), nb::arg("k_weight"), nb::arg("token_mask").none(), nb::arg("eps"),
          "Engram gated residual update; returns the new X [S, n, H].");
}

}  // namespace dsv41rt::bindings
