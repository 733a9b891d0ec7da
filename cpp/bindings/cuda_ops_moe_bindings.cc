// dsv41rt._core.cuda_ops bindings of the MoE, Engram and sampling CUDA kernels. Signatures mirror
// the CPU ops (ops_moe_bindings.cc, ops_sampling_bindings.cc) so a test calls both the same way.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <algorithm>
#include <optional>
#include <vector>

#include "runtime/status.h"
#ifdef DSV41RT_WITH_CUDA
#include "bindings/sampling_params.h"
#include "kernels/cuda/testing/moe_test_entry.h"
#endif

namespace nb = nanobind;

namespace dsv41rt::bindings {

#ifdef DSV41RT_WITH_CUDA
namespace {

namespace entry = kernels::cuda::testing;

template <typename T, size_t N>
using In = nb::ndarray<const T, nb::ndim<N>, nb::c_contig, nb::device::cpu>;
template <typename T>
using Out = nb::ndarray<nb::numpy, T>;

template <typename T>
Out<T> make_out(std::initializer_list<size_t> shape) {
  size_t n = 1;
  for (size_t d : shape) n *= d;
  auto* p = new T[n == 0 ? 1 : n];
  nb::capsule owner(p, [](void* q) noexcept { delete[] static_cast<T*>(q); });
  return Out<T>(p, shape, owner);
}

nb::tuple moe_route_np(In<float, 2> x, In<float, 2> gate_w, std::optional<In<float, 1>> bias,
                       int64_t k, float routed_scaling_factor, bool normalize) {
  const int64_t S = x.shape(0), H = x.shape(1), E = gate_w.shape(0);
  DSV41RT_CHECK(gate_w.shape(1) == size_t(H), "moe_route: gate_w has ", gate_w.shape(1),
                " columns, x has ", H);
  DSV41RT_CHECK(!bias || bias->shape(0) == size_t(E), "moe_route: bias length != E = ", E);
  DSV41RT_CHECK(k >= 1 && k <= E, "moe_route: k=", k, " E=", E);
  auto idx = make_out<int32_t>({size_t(S), size_t(k)});
  auto w = make_out<float>({size_t(S), size_t(k)});
  {
    nb::gil_scoped_release release;
    entry::moe_route(x.data(), gate_w.data(), bias ? bias->data() : nullptr, S, H, E, k,
                     routed_scaling_factor, normalize, idx.data(), w.data());
  }
  return nb::make_tuple(idx, w);
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
  if (has_shared) {
    Is = sw1->shape(0);
    DSV41RT_CHECK(sw1->shape(1) == size_t(H) && sw3->shape(0) == size_t(Is) &&
                      sw3->shape(1) == size_t(H) && sw2->shape(0) == size_t(H) &&
                      sw2->shape(1) == size_t(Is),
                  "moe_forward: expected shared w1, w3 [Is, H] and w2 [H, Is]");
  }
  auto y = make_out<float>({size_t(S), size_t(H)});
  {
    nb::gil_scoped_release release;
    entry::moe_forward(x.data(), idx.data(), weight.data(), S, H, k, E, I, w1.data(), w3.data(),
                       w2.data(), has_shared ? sw1->data() : nullptr,
                       has_shared ? sw3->data() : nullptr, has_shared ? sw2->data() : nullptr, Is,
                       limit, y.data());
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
  auto rows = make_out<int64_t>({size_t(S), size_t(cols)});
  {
    nb::gil_scoped_release release;
    entry::engram_hash_rows(compressed_ids.data(), S, max_ngram, n_heads, multipliers.data(),
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
  auto y = make_out<float>({size_t(S), size_t(n), size_t(H)});
  {
    nb::gil_scoped_release release;
    std::copy(X.data(), X.data() + S * n * H, y.data());
    entry::engram_forward(
        y.data(), emb.data(), wkv.data(), q_weight.data(), k_weight.data(),
        token_mask ? reinterpret_cast<const uint8_t*>(token_mask->data()) : nullptr, S, n, H, D,
        eps);
  }
  return y;
}

using Logits = nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using Tokens = nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

struct History {
  const int32_t* prompt = nullptr;
  int64_t n_prompt = 0;
  const int32_t* output = nullptr;
  int64_t n_output = 0;
};

History history(const std::optional<Tokens>& prompt, const std::optional<Tokens>& output) {
  History h;
  if (prompt) h.prompt = prompt->data(), h.n_prompt = int64_t(prompt->shape(0));
  if (output) h.output = output->data(), h.n_output = int64_t(output->shape(0));
  return h;
}

Out<float> sampling_probs_np(Logits logits, nb::dict params, std::optional<Tokens> prompt,
                             std::optional<Tokens> output) {
  const kernels::cpu::SamplingParams p = sampling_params_from_dict(params);
  const History h = history(prompt, output);
  const int64_t V = logits.shape(0);
  auto out = make_out<float>({size_t(V)});
  nb::gil_scoped_release release;
  entry::sampling_probs(logits.data(), V, p, h.prompt, h.n_prompt, h.output, h.n_output,
                        out.data());
  return out;
}

nb::tuple sample_token_np(Logits logits, nb::dict params, std::optional<Tokens> prompt,
                          std::optional<Tokens> output, uint64_t step) {
  const kernels::cpu::SamplingParams p = sampling_params_from_dict(params);
  const History h = history(prompt, output);
  const int64_t V = logits.shape(0);
  kernels::cpu::SampledToken s;
  {
    nb::gil_scoped_release release;
    s = entry::sample_token(logits.data(), V, p, h.prompt, h.n_prompt, h.output, h.n_output, step);
  }
  auto ids = make_out<int32_t>({s.top_ids.size()});
  auto lps = make_out<float>({s.top_logprobs.size()});
  for (size_t i = 0; i < s.top_ids.size(); ++i) {
    ids.data()[i] = s.top_ids[i];
    lps.data()[i] = s.top_logprobs[i];
  }
  return nb::make_tuple(s.token, s.logprob, ids, lps);
}

}  // namespace

void register_cuda_ops_moe(nb::module_& ops) {
  ops.def("moe_route", &moe_route_np, nb::arg("x"), nb::arg("gate_w"), nb::arg("bias").none(),
          nb::arg("k"), nb::arg("routed_scaling_factor"), nb::arg("normalize") = true,
          "CUDA score routing: returns (idx int32 [S, k], weight float32 [S, k]).");
  ops.def("moe_forward", &moe_forward_np, nb::arg("x"), nb::arg("idx"), nb::arg("weight"),
          nb::arg("w1"), nb::arg("w3"), nb::arg("w2"), nb::arg("shared_w1").none(),
          nb::arg("shared_w3").none(), nb::arg("shared_w2").none(), nb::arg("limit"),
          "CUDA routed experts (stacked w1, w3 [E, I, H], w2 [E, H, I]) + shared expert.");
  ops.def("engram_hash_rows", &engram_hash_rows_np, nb::arg("compressed_ids"), nb::arg("n_heads"),
          nb::arg("multipliers"), nb::arg("primes"), nb::arg("offsets"), nb::arg("pad_id"),
          "CUDA Engram row ids [S, (max_ngram-1)*n_heads] of one layer.");
  ops.def("engram_forward", &engram_forward_np, nb::arg("X"), nb::arg("emb"), nb::arg("wkv"),
          nb::arg("q_weight"), nb::arg("k_weight"), nb::arg("token_mask").none(), nb::arg("eps"),
          "CUDA Engram gated residual update; returns the new X [S, n, H].");
  ops.def("sampling_probs", &sampling_probs_np, nb::arg("logits"), nb::arg("params"),
          nb::arg("prompt").none() = nb::none(), nb::arg("output").none() = nb::none(),
          "CUDA filtered distribution (kernels/sampling.h): float32 [V].");
  ops.def("sample_token", &sample_token_np, nb::arg("logits"), nb::arg("params"),
          nb::arg("prompt").none() = nb::none(), nb::arg("output").none() = nb::none(),
          nb::arg("step") = 0,
          "CUDA seeded draw: (token, logprob, top_ids int32 [n], top_logprobs float32 [n]).");
}
#else
void register_cuda_ops_moe(nb::module_&) {}
#endif

}  // namespace dsv41rt::bindings
