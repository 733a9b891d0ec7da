// Hand-computed cases for the attention-side ops (sparse attention, compressor pooling, indexer
// scores, candidate blocks, top-k). Random cross-checks against NeMo live in
// tests/python/test_ops_attention.py.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/status.h"
#include "kernels/attention.h"
#include "kernels/compressor.h"
#include "kernels/indexer.h"

namespace dsv41rt::kernels::cpu {
namespace {

const float kNaN = std::nanf("");

TEST(SparseAttention, SingleKeyAndSink) {
  // One head, D = 2: logit = scale * q·k = 2; weight e^2 / (e^2 + e^sink).
  std::vector<float> q = {1, 0}, kv = {2, 0, 5, 5}, sink = {0}, out(2, kNaN);
  std::vector<int32_t> idx = {0, -1};
  sparse_attention(q.data(), kv.data(), idx.data(), sink.data(), 1, 1, 2, 2, 2, 1.0f, out.data());
  const float p = std::exp(2.0f) / (std::exp(2.0f) + 1.0f);
  EXPECT_NEAR(out[0], 2 * p, 1e-6);
  EXPECT_EQ(out[1], 0.0f);
}

TEST(SparseAttention, NoValidKeyGivesZeroAndBadIndexThrows) {
  std::vector<float> q = {1, 1}, kv = {1, 1}, sink = {3}, out(2, kNaN);
  std::vector<int32_t> none = {-1}, bad = {1};
  sparse_attention(q.data(), kv.data(), none.data(), sink.data(), 1, 1, 2, 1, 1, 1.0f, out.data());
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_THROW(sparse_attention(q.data(), kv.data(), bad.data(), sink.data(), 1, 1, 2, 1, 1, 1.0f,
                                out.data()),
               Error);
}

TEST(CompressPool, EqualScoresAverageAndLargeScoreSelects) {
  // Two groups of ratio 2, D = 2. Group 0: equal scores -> mean. Group 1: score gap 100 -> max.
  std::vector<float> values = {1, 2, 3, 6, 10, 20, 30, 40};
  std::vector<float> scores = {0, 5, 0, 5, 100, 0, 0, 100};
  std::vector<float> out(4, kNaN);
  compress_pool(values.data(), scores.data(), 2, 2, 2, out.data());
  EXPECT_FLOAT_EQ(out[0], 2.0f);
  EXPECT_FLOAT_EQ(out[1], 4.0f);
  EXPECT_FLOAT_EQ(out[2], 10.0f);
  EXPECT_FLOAT_EQ(out[3], 40.0f);
}

TEST(IndexerScores, ReluWeightedSumAndVisibility) {
  // S = 1, H = 2, D = 1, T = 3 keys {1, -1, 2}; q = {2, 3}; w = {0.5, -1}; visible 2.
  std::vector<float> q = {2, 3}, keys = {1, -1, 2}, w = {0.5, -1}, scores(3, kNaN);
  std::vector<int64_t> vis = {2};
  indexer_scores(q.data(), keys.data(), w.data(), vis.data(), 1, 2, 1, 3, scores.data());
  EXPECT_FLOAT_EQ(scores[0], 2 * 0.5f + 3 * -1.0f);  // relu(2)*0.5 + relu(3)*-1
  EXPECT_FLOAT_EQ(scores[1], 0.0f);                  // both dots negative -> relu 0
  EXPECT_TRUE(std::isinf(scores[2]) && scores[2] < 0);
}

TEST(CandidateBlocks, NewestBlockForcedAndInvisibleDropped) {
  // T = 8 entries, blocks of 2, keep 2 blocks. Visible 7: newest block is 3 (entries 6, 7*).
  const float ninf = -INFINITY;
  std::vector<float> s = {5, 1, 9, 0, 2, 3, 0.5, ninf};
  std::vector<int64_t> vis = {7};
  std::vector<uint8_t> mask(8, 7);
  candidate_blocks(s.data(), vis.data(), 1, 8, 2, 2, mask.data());
  // Kept: block 3 (forced, only entry 6 visible) and block 1 (max 9).
  EXPECT_EQ(mask, (std::vector<uint8_t>{0, 0, 1, 1, 0, 0, 1, 0}));
  // Nothing visible: no block forced, every block -inf -> nothing kept.
  std::vector<float> none(8, ninf);
  std::vector<int64_t> zero = {0};
  candidate_blocks(none.data(), zero.data(), 1, 8, 2, 2, mask.data());
  EXPECT_EQ(mask, std::vector<uint8_t>(8, 0));
}

TEST(TopkSelect, SortedIndicesAndPadding) {
  const float ninf = -INFINITY;
  std::vector<float> s = {0.1f, 7, ninf, 3, 7};
  std::vector<int32_t> out(4, 99);
  topk_select(s.data(), 1, 5, 4, out.data());
  EXPECT_EQ(out, (std::vector<int32_t>{0, 1, 3, 4}));
  topk_select(s.data(), 1, 5, 2, out.data());
  EXPECT_EQ(out[0], 1);
  EXPECT_EQ(out[1], 4);
  std::vector<int32_t> wide(6, 99);
  topk_select(s.data(), 1, 5, 6, wide.data());
  EXPECT_EQ(wide, (std::vector<int32_t>{0, 1, 3, 4, -1, -1}));
}

}  // namespace
}  // namespace dsv41rt::kernels::cpu
