// Implementation of bindings/engram_binders.h (see there).
#include "bindings/engram_binders.h"

#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>

#include <algorithm>
#include <optional>

#include "core/status.h"

namespace nb = nanobind;

namespace dsv41rt::bindings {
namespace {

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

Out<int64_t> engram_hash_rows_np(EngramFns::HashRows fn, In<int64_t, 1> compressed_ids,
                                 int64_t n_heads, In<int64_t, 1> multipliers, In<int64_t, 1> primes,
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
    fn(compressed_ids.data(), S, max_ngram, n_heads, multipliers.data(), primes.data(),
       offsets.data(), pad_id, rows.data());
  }
  return rows;
}

Out<float> engram_forward_np(EngramFns::Forward fn, In<float, 3> X, In<float, 2> emb,
                             In<float, 2> wkv, In<float, 2> q_weight, In<float, 2> k_weight,
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
    fn(y.data(), emb.data(), wkv.data(), q_weight.data(), k_weight.data(),
       token_mask ? reinterpret_cast<const uint8_t*>(token_mask->data()) : nullptr, S, n, H, D,
       eps);
  }
  return y;
}

}  // namespace

void register_engram_family(nb::module_& ops, const EngramFns& k) {
  ops.def(
      "engram_hash_rows",
      [k](In<int64_t, 1> compressed_ids, int64_t n_heads, In<int64_t, 1> multipliers,
          In<int64_t, 1> primes, In<int64_t, 1> offsets, int64_t pad_id) {
        return engram_hash_rows_np(k.engram_hash_rows, compressed_ids, n_heads, multipliers, primes,
                                   offsets, pad_id);
      },
      nb::arg("compressed_ids"), nb::arg("n_heads"), nb::arg("multipliers"), nb::arg("primes"),
      nb::arg("offsets"), nb::arg("pad_id"),
      "Engram row ids [S, (max_ngram-1)*n_heads] of one layer; compressed_ids = "
      "max_ngram-1 history slots then S positions, negative = blocking.");
  ops.def(
      "engram_forward",
      [k](In<float, 3> X, In<float, 2> emb, In<float, 2> wkv, In<float, 2> q_weight,
          In<float, 2> k_weight, std::optional<In<bool, 1>> token_mask, float eps) {
        return engram_forward_np(k.engram_forward, X, emb, wkv, q_weight, k_weight, token_mask,
                                 eps);
      },
      nb::arg("X"), nb::arg("emb"), nb::arg("wkv"), nb::arg("q_weight"), nb::arg("k_weight"),
      nb::arg("token_mask").none(), nb::arg("eps"),
      "Engram gated residual update; returns the new X [S, n, H].");
}

}  // namespace dsv41rt::bindings
