// dsv41rt._core.ops bindings of the attention-side CPU ops (kernels/attention.h, compressor.h,
// indexer.h): numpy in, fresh numpy out, GIL released around the compute.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <cstring>

#include "bindings/numpy_io.h"
#include "core/status.h"
#include "kernels/attention.h"
#include "kernels/compressor.h"
#include "kernels/indexer.h"

namespace nb = nanobind;

namespace dsv41rt::bindings {
namespace {

nb::ndarray<nb::numpy, float> sparse_attention_np(In<float, 3> q, In<float, 2> kv,
                                                  In<int32_t, 2> indices, In<float, 1> sink,
                                                  float scale) {
  const int64_t S = q.shape(0), H = q.shape(1), D = q.shape(2), T = kv.shape(0),
                K = indices.shape(1);
  DSV41RT_CHECK(
      kv.shape(1) == size_t(D) && indices.shape(0) == size_t(S) && sink.shape(0) == size_t(H),
      "sparse_attention: inconsistent shapes");
  auto out = new_array<float>({size_t(S), size_t(H), size_t(D)});
  nb::gil_scoped_release release;
  kernels::cpu::sparse_attention(q.data(), kv.data(), indices.data(), sink.data(), S, H, D, T, K,
                                 scale, out.data());
  return out;
}

nb::ndarray<nb::numpy, float> compress_pool_np(In<float, 2> values, In<float, 2> scores,
                                               int64_t ratio) {
  DSV41RT_CHECK(ratio >= 1 && values.shape(0) % ratio == 0, "compress_pool: ", values.shape(0),
                " rows is not a whole number of groups of ", ratio);
  DSV41RT_CHECK(values.shape(0) == scores.shape(0) && values.shape(1) == scores.shape(1),
                "compress_pool: values and scores differ in shape");
  const int64_t G = values.shape(0) / ratio, D = values.shape(1);
  auto out = new_array<float>({size_t(G), size_t(D)});
  nb::gil_scoped_release release;
  kernels::cpu::compress_pool(values.data(), scores.data(), G, ratio, D, out.data());
  return out;
}

nb::ndarray<nb::numpy, float> indexer_scores_np(In<float, 3> q, In<float, 2> keys, In<float, 2> w,
                                                In<int64_t, 1> n_visible) {
  const int64_t S = q.shape(0), H = q.shape(1), D = q.shape(2), T = keys.shape(0);
  DSV41RT_CHECK(keys.shape(1) == size_t(D) && w.shape(0) == size_t(S) && w.shape(1) == size_t(H) &&
                    n_visible.shape(0) == size_t(S),
                "indexer_scores: inconsistent shapes");
  auto out = new_array<float>({size_t(S), size_t(T)});
  nb::gil_scoped_release release;
  kernels::cpu::indexer_scores(q.data(), keys.data(), w.data(), n_visible.data(), S, H, D, T,
                               out.data());
  return out;
}

nb::ndarray<nb::numpy, uint8_t> candidate_blocks_np(In<float, 2> scores, In<int64_t, 1> n_visible,
                                                    int64_t topk_blocks, int64_t block_size) {
  const int64_t S = scores.shape(0), T = scores.shape(1);
  DSV41RT_CHECK(n_visible.shape(0) == size_t(S), "candidate_blocks: n_visible length");
  auto out = new_array<uint8_t>({size_t(S), size_t(T)});
  nb::gil_scoped_release release;
  kernels::cpu::candidate_blocks(scores.data(), n_visible.data(), S, T, topk_blocks, block_size,
                                 out.data());
  return out;
}

nb::ndarray<nb::numpy, int32_t> topk_select_np(In<float, 2> scores, int64_t k) {
  const int64_t S = scores.shape(0), T = scores.shape(1);
  auto out = new_array<int32_t>({size_t(S), size_t(k)});
  nb::gil_scoped_release release;
  kernels::cpu::topk_select(scores.data(), S, T, k, out.data());
  return out;
}

}  // namespace

void register_ops_attention(nb::module_& ops) {
  ops.def("sparse_attention", &sparse_attention_np, nb::arg("q"), nb::arg("kv"), nb::arg("indices"),
          nb::arg("sink"), nb::arg("scale"));
  ops.def("compress_pool", &compress_pool_np, nb::arg("values"), nb::arg("scores"),
          nb::arg("ratio"));
  ops.def("indexer_scores", &indexer_scores_np, nb::arg("q"), nb::arg("keys"), nb::arg("w"),
          nb::arg("n_visible"));
  ops.def("candidate_blocks", &candidate_blocks_np, nb::arg("scores"), nb::arg("n_visible"),
          nb::arg("topk_blocks"), nb::arg("block_size"));
  ops.def("topk_select", &topk_select_np, nb::arg("scores"), nb::arg("k"));
}

}  // namespace dsv41rt::bindings
