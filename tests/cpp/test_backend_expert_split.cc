// Expert parallelism by partial sums (Backend::expert_split, kernels/moe.h moe_local_ids).
//
// moe_local_ids: every backend against the CPU reference and the contract, bitwise.
// Partial sums (backends that split experts so; the CUDA one): the experts of each rank's shard
// run through moe_experts with local ids (the other ranks' ids are skipped), rank 0 adding the
// shared expert; the ranks' outputs summed must give the one-rank moe_experts within FP32
// summation-order error: every slot's output is computed by the same kernel from the same inputs
// (per-token activations, per-expert hidden units), only the k + 1 slot terms are added in another
// grouping, so |Δ| <= 1e-5 · max|y| (k + 1 <= 7 terms). Checked on the decode kernel (<= 64 rows,
// tensor cores, BF16 and FP8 activations), the grouped tensor-core path and the FP32 split kernel.
#include <algorithm>

#include "backend_test_util.h"
#include "kernels/moe.h"

namespace dsv41rt::testing {
namespace {

using model::LayerWeights;
using model::Matrix;
using model::WeightFormat;

class BackendExpertSplit : public BackendTest {};

TEST_P(BackendExpertSplit, LocalIdsShiftTheRanksIdsAndParkTheOthers) {
  Backend& be = backend();
  for (const int64_t n : {int64_t(1), int64_t(37), int64_t(6 * 64), int64_t(300000)}) {
    std::vector<int32_t> ids(static_cast<size_t>(n));
    for (int32_t& v : ids) v = int32_t(randint(0, 383));
    const int64_t count = randint(1, 192), begin = randint(0, 384 - count);
    ids[0] = int32_t(std::max<int64_t>(begin - 1, 0));  // the id below the shard: not -1 locally
    Buffer<int32_t> d = upload(be, ids), out = poisoned<int32_t>(be, n);
    be.moe_local_ids(d.get(), n, begin, count, out.get(), be.stream(0));
    std::vector<int32_t> want(ids.size());
    kernels::cpu::moe_local_ids(ids.data(), n, begin, count, want.data());
    EXPECT_EQ(out.download(), want) << "n " << n << " begin " << begin << " count " << count;
    for (size_t i = 0; i < ids.size(); ++i) {
      const bool mine = ids[i] >= begin && ids[i] < begin + count;
      ASSERT_EQ(want[i], mine ? ids[i] - int32_t(begin) : int32_t(count)) << ids[i];
    }
  }
}

TEST_P(BackendExpertSplit, RanksPartialSumsAreTheOneRankBlock) {
  Backend& be = backend();
  if (be.expert_split() != Backend::ExpertSplit::kPartialSums) {
    GTEST_SKIP() << be.device() << " splits experts by slots (test_tensor_expert_parallel.py)";
  }
  const int64_t H = 256, I = 128, E = 8, k = 6;
  auto bf16_exact = [&](int64_t n, double sigma) {
    std::vector<float> w = normal(n, sigma);
    for (float& v : w) v = round_bf16(v);
    return w;
  };
  const std::vector<float> w1 = bf16_exact(E * I * H, 0.3), w3 = bf16_exact(E * I * H, 0.3),
                           w2 = bf16_exact(E * H * I, 0.1), s1 = bf16_exact(I * H, 0.3),
                           s3 = bf16_exact(I * H, 0.3), s2 = bf16_exact(H * I, 0.1);
  auto bits = [](const std::vector<float>& w) {
    std::vector<uint16_t> b;
    for (const float v : w) b.push_back(bf16_bits(v));
    return b;
  };
  Buffer<uint16_t> d1 = upload(be, bits(w1)), d3 = upload(be, bits(w3)), d2 = upload(be, bits(w2)),
                   ds1 = upload(be, bits(s1)), ds3 = upload(be, bits(s3)),
                   ds2 = upload(be, bits(s2));
  struct Path {
    int64_t S;
    bool tc, fp8;
    const char* name;
  };
  for (const Path p : {Path{4, true, false, "decode kernel"}, Path{64, true, true, "decode fp8"},
                       Path{130, true, false, "grouped"}, Path{9, false, false, "fp32 split"}}) {
    SCOPED_TRACE(p.name);
    const int64_t S = p.S;
    const std::vector<float> x = normal(S * H, 2.0), wt = uniform(S * k, 0.1, 1.0);
    std::vector<int32_t> idx(static_cast<size_t>(S * k));
    for (int64_t t = 0; t < S; ++t) {
      const std::vector<int64_t> perm = permutation(E);
      for (int64_t j = 0; j < k; ++j) idx[t * k + j] = int32_t(perm[j]);
    }
    Buffer<float> dx = upload(be, x), dwt = upload(be, wt);
    Buffer<int32_t> didx = upload(be, idx);
    ScratchArena scratch(be);
    be.set_forward_rows(S, true);
    be.set_tensor_cores(p.tc);
    be.set_fp8_activations(p.fp8);
    // Experts [begin, begin + count) of the stacks, shared expert when `shared`.
    auto block = [&](int64_t begin, int64_t count, bool shared) {
      LayerWeights L;
      auto m = [](const uint16_t* d) { return Matrix{d, WeightFormat::kBF16, true}; };
      L.w1 = m(d1.get() + begin * I * H), L.w3 = m(d3.get() + begin * I * H);
      L.w2 = m(d2.get() + begin * H * I);
      L.expert_begin = begin, L.expert_count = count;
      if (shared)
        L.shared_w1 = m(ds1.get()), L.shared_w3 = m(ds3.get()), L.shared_w2 = m(ds2.get());
      for (Matrix* w : {&L.w1, &L.w3, &L.w2, &L.shared_w1, &L.shared_w3, &L.shared_w2}) {
        w->fp8_input = p.fp8;
      }
      Buffer<int32_t> local = poisoned<int32_t>(be, S * k);
      be.moe_local_ids(didx.get(), S * k, begin, count, local.get(), be.stream(0));
      Buffer<float> y = poisoned<float>(be, S * H);
      be.moe_experts(dx.get(), local.get(), dwt.get(), S, H, k, count, I, L, 10.0f, y.get(),
                     scratch.get(), be.stream(0));
      return y.download();
    };
    const std::vector<float> one = block(0, E, true);
    ASSERT_TRUE(all_written(one));
    for (const int64_t P : {int64_t(2), int64_t(4)}) {
      std::vector<float> sum(one.size(), 0.0f);
      for (int64_t r = 0; r < P; ++r) {
        const std::vector<float> y = block(r * E / P, E / P, r == 0);
        ASSERT_TRUE(all_written(y)) << "rank " << r << " of " << P;
        for (size_t i = 0; i < sum.size(); ++i) sum[i] += y[i];
      }
      EXPECT_LE(rel_error(sum, one), 1e-5) << P << " ranks";
    }
    be.set_fp8_activations(false);
    be.set_tensor_cores(false);
    be.set_forward_rows(1 << 20, false);
  }
}

DSV41RT_INSTANTIATE_BACKENDS(BackendExpertSplit);

}  // namespace
}  // namespace dsv41rt::testing
