// dsv41rt._core.cuda_ops bindings of the MoE, Engram and sampling CUDA kernels. Signatures mirror
// the CPU ops (ops_moe_bindings.cc, ops_sampling_bindings.cc) so a test calls both the same way.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <algorithm>
#include <optional>
#include <vector>

#include "bindings/engram_binders.h"
#include "bindings/sampling_binders.h"
#include "core/status.h"
#ifdef DSV41RT_WITH_CUDA
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

// The shapes of a routed + shared expert call, checked once for every MoE entry point:
// x [S, H], idx / weight [S, k], w1 / w3 [E, I, H], w2 [E, H, I], shared [Is, H] / [H, Is].
struct MoeCall {
  int64_t S, H, k, E, I, Is = 0;
  const float *s1 = nullptr, *s3 = nullptr, *s2 = nullptr;
};

MoeCall moe_call(const char* op, const In<float, 2>& x, const In<int32_t, 2>& idx,
                 const In<float, 2>& weight, const In<float, 3>& w1, const In<float, 3>& w3,
                 const In<float, 3>& w2, const std::optional<In<float, 2>>& sw1,
                 const std::optional<In<float, 2>>& sw3, const std::optional<In<float, 2>>& sw2) {
  MoeCall c{int64_t(x.shape(0)), int64_t(x.shape(1)), int64_t(idx.shape(1)), int64_t(w1.shape(0)),
            int64_t(w1.shape(1))};
  DSV41RT_CHECK(idx.shape(0) == size_t(c.S) && weight.shape(0) == size_t(c.S) &&
                    weight.shape(1) == size_t(c.k),
                op, ": idx / weight must be [S, k]");
  DSV41RT_CHECK(w1.shape(2) == size_t(c.H) && w3.shape(0) == size_t(c.E) &&
                    w3.shape(1) == size_t(c.I) && w3.shape(2) == size_t(c.H) &&
                    w2.shape(0) == size_t(c.E) && w2.shape(1) == size_t(c.H) &&
                    w2.shape(2) == size_t(c.I),
                op, ": expected w1, w3 [E, I, H] and w2 [E, H, I]");
  const bool shared = sw1.has_value();
  DSV41RT_CHECK(shared == sw3.has_value() && shared == sw2.has_value(), op,
                ": give all or none of shared_w1, shared_w3, shared_w2");
  if (shared) {
    c.Is = int64_t(sw1->shape(0));
    DSV41RT_CHECK(sw1->shape(1) == size_t(c.H) && sw3->shape(0) == size_t(c.Is) &&
                      sw3->shape(1) == size_t(c.H) && sw2->shape(0) == size_t(c.H) &&
                      sw2->shape(1) == size_t(c.Is),
                  op, ": expected shared w1, w3 [Is, H] and w2 [H, Is]");
    c.s1 = sw1->data(), c.s3 = sw3->data(), c.s2 = sw2->data();
  }
  return c;
}

Out<float> moe_forward_np(In<float, 2> x, In<int32_t, 2> idx, In<float, 2> weight, In<float, 3> w1,
                          In<float, 3> w3, In<float, 3> w2, std::optional<In<float, 2>> sw1,
                          std::optional<In<float, 2>> sw3, std::optional<In<float, 2>> sw2,
                          float limit) {
  const MoeCall c = moe_call("moe_forward", x, idx, weight, w1, w3, w2, sw1, sw3, sw2);
  auto y = make_out<float>({size_t(c.S), size_t(c.H)});
  {
    nb::gil_scoped_release release;
    entry::moe_forward(x.data(), idx.data(), weight.data(), c.S, c.H, c.k, c.E, c.I, w1.data(),
                       w3.data(), w2.data(), c.s1, c.s3, c.s2, c.Is, limit, y.data());
  }
  return y;
}

Out<float> moe_forward_split_np(In<float, 2> x, In<int32_t, 2> idx, In<float, 2> weight,
                                In<float, 3> w1, In<float, 3> w3, In<float, 3> w2,
                                std::optional<In<float, 2>> sw1, std::optional<In<float, 2>> sw3,
                                std::optional<In<float, 2>> sw2, float limit, int64_t chunk,
                                bool bf16_weights) {
  const MoeCall c = moe_call("moe_forward_split", x, idx, weight, w1, w3, w2, sw1, sw3, sw2);
  auto y = make_out<float>({size_t(c.S), size_t(c.H)});
  {
    nb::gil_scoped_release release;
    entry::moe_forward_split(x.data(), idx.data(), weight.data(), c.S, c.H, c.k, c.E, c.I,
                             w1.data(), w3.data(), w2.data(), c.s1, c.s3, c.s2, c.Is, limit, chunk,
                             bf16_weights, y.data());
  }
  return y;
}

// x [M, G * K], w [G, N, K] -> [M, G * N]: G independent GEMMs (G = 1: a plain linear).
Out<float> gemm_bf16_tc_np(In<float, 2> x, In<float, 3> w, std::optional<In<float, 2>> y0) {
  const int64_t M = x.shape(0), G = w.shape(0), N = w.shape(1), K = w.shape(2);
  DSV41RT_CHECK(x.shape(1) == size_t(G * K), "gemm_bf16_tc: x has ", x.shape(1),
                " columns, w needs G * K = ", G * K);
  DSV41RT_CHECK(!y0 || (y0->shape(0) == size_t(M) && y0->shape(1) == size_t(G * N)),
                "gemm_bf16_tc: y0 must be [M, G * N]");
  auto y = make_out<float>({size_t(M), size_t(G * N)});
  if (y0) std::copy(y0->data(), y0->data() + M * G * N, y.data());
  {
    nb::gil_scoped_release release;
    entry::gemm_bf16_tc(x.data(), G * K, w.data(), K, y.data(), G * N, M, N, K, y0.has_value(), G,
                        K, N * K, N, M * G * K, G * N * K, M * G * N);
  }
  return y;
}

Out<float> moe_grouped_bf16_np(In<float, 2> x, In<int32_t, 2> idx, In<float, 2> weight,
                               In<float, 3> w1, In<float, 3> w3, In<float, 3> w2,
                               std::optional<In<float, 2>> sw1, std::optional<In<float, 2>> sw3,
                               std::optional<In<float, 2>> sw2, float limit) {
  const MoeCall c = moe_call("moe_grouped_bf16", x, idx, weight, w1, w3, w2, sw1, sw3, sw2);
  auto y = make_out<float>({size_t(c.S), size_t(c.H)});
  {
    nb::gil_scoped_release release;
    entry::moe_grouped_bf16(x.data(), idx.data(), weight.data(), c.S, c.H, c.k, c.E, c.I, w1.data(),
                            w3.data(), w2.data(), c.s1, c.s3, c.s2, c.Is, limit, y.data());
  }
  return y;
}

}  // namespace

void register_cuda_ops_moe(nb::module_& ops) {
  ops.def("gemm_bf16_tc", &gemm_bf16_tc_np, nb::arg("x"), nb::arg("w"),
          nb::arg("y0").none() = nb::none(),
          "Tensor-core GEMM, BF16 inputs (x and w rounded), FP32 accumulation: x [M, G * K] times "
          "w [G, N, K] per group -> [M, G * N], plus y0 when given.");
  ops.def("gemm_bf16_tc_time_ms", &entry::gemm_bf16_tc_time_ms, nb::arg("M"), nb::arg("N"),
          nb::arg("K"), nb::arg("reps") = 10,
          "Median device ms of the tensor-core GEMM on random device data (bench/).");
  ops.def("moe_grouped_bf16", &moe_grouped_bf16_np, nb::arg("x"), nb::arg("idx"), nb::arg("weight"),
          nb::arg("w1"), nb::arg("w3"), nb::arg("w2"), nb::arg("shared_w1").none(),
          nb::arg("shared_w3").none(), nb::arg("shared_w2").none(), nb::arg("limit"),
          "Tensor-core MoE over expert-grouped rows (weights rounded to BF16).");
  ops.def("moe_forward_split", &moe_forward_split_np, nb::arg("x"), nb::arg("idx"),
          nb::arg("weight"), nb::arg("w1"), nb::arg("w3"), nb::arg("w2"),
          nb::arg("shared_w1").none(), nb::arg("shared_w3").none(), nb::arg("shared_w2").none(),
          nb::arg("limit"), nb::arg("chunk"), nb::arg("bf16_weights") = false,
          "CUDA MoE through the split (hidden, then down) kernels, `chunk` tokens per pass.");
  ops.def("moe_route", &moe_route_np, nb::arg("x"), nb::arg("gate_w"), nb::arg("bias").none(),
          nb::arg("k"), nb::arg("routed_scaling_factor"), nb::arg("normalize") = true,
          "CUDA score routing: returns (idx int32 [S, k], weight float32 [S, k]).");
  ops.def("moe_forward", &moe_forward_np, nb::arg("x"), nb::arg("idx"), nb::arg("weight"),
          nb::arg("w1"), nb::arg("w3"), nb::arg("w2"), nb::arg("shared_w1").none(),
          nb::arg("shared_w3").none(), nb::arg("shared_w2").none(), nb::arg("limit"),
          "CUDA routed experts (stacked w1, w3 [E, I, H], w2 [E, H, I]) + shared expert.");
  register_engram_family(ops, EngramFns{entry::engram_hash_rows, entry::engram_forward});
  register_sampling_family(ops, SamplingFns{entry::sampling_probs, entry::sample_token});
}
#else
void register_cuda_ops_moe(nb::module_&) {}
#endif

}  // namespace dsv41rt::bindings
