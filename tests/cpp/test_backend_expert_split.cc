// Expert parallelism by partial sums (Backend::expert_split, kernels/moe.h moe_local_ids).
//
// moe_local_ids: every backend against the CPU reference and the contract, bitwise.
// Slots (the CPU): each rank's slots summed, then moe_combine, bitwise the one-rank block.
// Partial sums (the CUDA backend): the experts of each rank's shard run through moe_experts with
// local ids (the other ranks' ids are skipped), rank 0 adding the shared expert; the ranks' outputs
// summed must give the one-rank moe_experts within FP32 summation-order error: every slot's output
// is computed by the same kernel from the same inputs (per-token activations, per-expert hidden
// units), only the k + 1 slot terms are added in another grouping, so |Δ| <= 1e-5 · max|y|
// (k + 1 <= 7 terms). Checked on the decode kernel (<= 64 rows, tensor cores, BF16 and FP8
// activations), the grouped tensor-core path and the FP32 split kernel (CUDA; the CPU runs its
// FP32, BF16- and FP8-emulating evaluations of the same calls).
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

// Each backend's own scheme (Backend::expert_split): the ranks' outputs combined as the runner
// combines them against the one-rank block. kSlots (the CPU): each rank's slots, summed (exact),
// then moe_combine: bitwise. kPartialSums (CUDA): each rank's moe_experts over local ids, summed:
// within FP32 summation-order error.
TEST_P(BackendExpertSplit, RanksCombineToTheOneRankBlock) {
  Backend& be = backend();
  const bool partial = be.expert_split() == Backend::ExpertSplit::kPartialSums;
  const int64_t H = 256, I = 128, E = 8, k = 6;
  auto bf16_exact = [&](int64_t n, double sigma) {
    std::vector<float> w = normal(n, sigma);
    for (float& v : w) v = round_bf16(v);
    return w;
  };
  const std::vector<float> w1 = bf16_exact(E * I * H, 0.3), w3 = bf16_exact(E * I * H, 0.3),
                           w2 = bf16_exact(E * H * I, 0.1), s1 = bf16_exact(I * H, 0.3),
                           s3 = bf16_exact(I * H, 0.3), s2 = bf16_exact(H * I, 0.1);
  // BF16 storage on CUDA (its tensor-core paths), FP32 on the CPU (its matrices are FP32).
  auto bits = [](const std::vector<float>& w) {
    std::vector<uint16_t> b;
    for (const float v : w) b.push_back(bf16_bits(v));
    return b;
  };
  std::vector<Buffer<uint16_t>> keep16;
  std::vector<Buffer<float>> keep32;
  auto stored = [&](const std::vector<float>& w) -> std::pair<const uint8_t*, WeightFormat> {
    if (on_cuda()) {
      keep16.push_back(upload(be, bits(w)));
      return {reinterpret_cast<const uint8_t*>(keep16.back().get()), WeightFormat::kBF16};
    }
    keep32.push_back(upload(be, w));
    return {reinterpret_cast<const uint8_t*>(keep32.back().get()), WeightFormat::kF32};
  };
  const auto d1 = stored(w1), d3 = stored(w3), d2 = stored(w2), ds1 = stored(s1), ds3 = stored(s3),
             ds2 = stored(s2);
  const int64_t elem = on_cuda() ? 2 : 4;
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
    // The weights of experts [begin, begin + count), the shared expert when `shared`.
    auto weights = [&](int64_t begin, int64_t count, bool shared) {
      LayerWeights L;
      auto m = [&](std::pair<const uint8_t*, WeightFormat> d, int64_t offset) {
        Matrix mat{d.first + offset * elem, d.second, true};
        mat.fp8_input = p.fp8;
        return mat;
      };
      L.w1 = m(d1, begin * I * H), L.w3 = m(d3, begin * I * H), L.w2 = m(d2, begin * H * I);
      L.expert_begin = begin, L.expert_count = count;
      if (shared) L.shared_w1 = m(ds1, 0), L.shared_w3 = m(ds3, 0), L.shared_w2 = m(ds2, 0);
      return L;
    };
    Buffer<float> y1 = poisoned<float>(be, S * H);
    be.moe_experts(dx.get(), didx.get(), dwt.get(), S, H, k, E, I, weights(0, E, true), 10.0f,
                   y1.get(), scratch.get(), be.stream(0));
    const std::vector<float> one = y1.download();
    ASSERT_TRUE(all_written(one));
    for (const int64_t P : {int64_t(2), int64_t(4)}) {
      const int64_t per = E / P, n = partial ? S * H : S * k * H;
      std::vector<float> sum(size_t(n), 0.0f);  // the all-reduce: ranks added in rank order
      for (int64_t r = 0; r < P; ++r) {
        Buffer<float> out = poisoned<float>(be, n);
        if (partial) {
          Buffer<int32_t> local = poisoned<int32_t>(be, S * k);
          be.moe_local_ids(didx.get(), S * k, r * per, per, local.get(), be.stream(0));
          be.moe_experts(dx.get(), local.get(), dwt.get(), S, H, k, per, I,
                         weights(r * per, per, r == 0), 10.0f, out.get(), scratch.get(),
                         be.stream(0));
        } else {
          be.moe_expert_slots(dx.get(), didx.get(), dwt.get(), S, H, k, E, I,
                              weights(r * per, per, true), 10.0f, out.get(), scratch.get(),
                              be.stream(0));
        }
        const std::vector<float> got = out.download();
        ASSERT_TRUE(all_written(got)) << "rank " << r << " of " << P;
        for (size_t i = 0; i < sum.size(); ++i) sum[i] += got[i];
      }
      if (partial) {
        EXPECT_LE(rel_error(sum, one), 1e-5) << P << " ranks";
        continue;
      }
      Buffer<float> slots = upload(be, sum), y = poisoned<float>(be, S * H);
      be.moe_combine(dx.get(), didx.get(), slots.get(), S, H, k, I, weights(0, 0, true), 10.0f,
                     y.get(), scratch.get(), be.stream(0));
      EXPECT_TRUE(bitwise_equal(y.download(), one)) << P << " ranks";
    }
    be.set_fp8_activations(false);
    be.set_tensor_cores(false);
    be.set_forward_rows(1 << 20, false);
  }
}

DSV41RT_INSTANTIATE_BACKENDS(BackendExpertSplit);

}  // namespace
}  // namespace dsv41rt::testing
