// Speculative decoding through the C API (dsv41rt_runtime_params::speculative_config, vLLM's JSON):
// the greedy tokens equal those without, dsv41rt_stats counts the drafts; a bad config is an
// invalid-argument error naming what is wrong; a host built before the field (struct_size ending
// before it) runs without speculation, one built before the counters does not get them.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "c_api_test_util.h"
#include "dsv41rt/dsv41rt.h"

namespace {

const char* checkpoint() { return std::getenv("DSV41RT_TEST_CHECKPOINT"); }
const std::vector<int32_t> kPrompt = {0, 671, 6102, 13462, 17, 99, 4000};

std::vector<int32_t> greedy_tokens(const dsv41rt_runtime_params& p,
                                   dsv41rt_stats* stats = nullptr) {
  return dsv41rt::testing::c_api_generate(p, kPrompt, 10, stats);
}

}  // namespace

TEST(CApiSpeculation, SpeculativeConfigGivesThePlainTokens) {
  if (!checkpoint()) GTEST_SKIP() << "set DSV41RT_TEST_CHECKPOINT to a tiny-v41 checkpoint";
  dsv41rt_runtime_params p;
  dsv41rt_runtime_default_params(&p);
  EXPECT_EQ(p.speculative_config, nullptr);
  p.checkpoint_dir = checkpoint();
  p.kv_memory = 64 << 20;
  const std::vector<int32_t> want = greedy_tokens(p);
  EXPECT_EQ(want.size(), 10u);
  dsv41rt_runtime_params spec = p;
  spec.speculative_config = R"({"method": "dspark", "num_speculative_tokens": 3})";
  dsv41rt_stats st;
  dsv41rt_stats_init(&st);
  EXPECT_EQ(greedy_tokens(spec, &st), want);
  EXPECT_GT(st.spec_decode_num_drafts, 0);  // one verify per step after the first token
  EXPECT_GE(st.spec_decode_num_draft_tokens, st.spec_decode_num_drafts);
  EXPECT_LE(st.spec_decode_num_accepted_tokens, st.spec_decode_num_draft_tokens);
  dsv41rt_stats older;  // a host built before the counters: they are not written
  dsv41rt_stats_init(&older);
  older.struct_size = offsetof(dsv41rt_stats, spec_decode_num_drafts);
  older.spec_decode_num_drafts = -7;
  EXPECT_EQ(greedy_tokens(spec, &older), want);
  EXPECT_EQ(older.spec_decode_num_drafts, -7);
  spec.speculative_config = R"({"method": "dspark"})";  // self-tuned up to the drafter's block
  EXPECT_EQ(greedy_tokens(spec), want);
  spec.speculative_config = R"({"method": "dspark", "disable_by_batch_size": 1})";
  EXPECT_EQ(greedy_tokens(spec), want);
  dsv41rt_runtime_params old = spec;  // the config sits in bytes an older host does not have
  old.struct_size = offsetof(dsv41rt_runtime_params, speculative_config);
  EXPECT_EQ(greedy_tokens(old), want);

  for (const auto& [text, message] : std::vector<std::pair<const char*, const char*>>{
           {R"({"method": "eagle"})", "\"method\" must be \"dspark\""},
           {R"({"method": "dspark", "num_speculative_tokens": -1})", "integer >= 0"},
           {R"({"method": "dspark", "k": 1})", "unknown key \"k\""},
           {R"({"method": "dspark", "disable_by_batch_size": 0})", "integer >= 1"},
           {"[1]", "must be a JSON object"},
           {"{", "not valid JSON"},
           {R"({"method": "dspark", "num_speculative_tokens": 6})", "block of 5"}}) {
    dsv41rt_runtime_params bad = p;
    bad.speculative_config = text;
    dsv41rt_runtime* rt = nullptr;
    EXPECT_NE(dsv41rt_runtime_create(DSV41RT_ABI_VERSION, &bad, &rt), DSV41RT_OK) << text;
    EXPECT_NE(std::string(dsv41rt_last_error(nullptr)).find(message), std::string::npos)
        << dsv41rt_last_error(nullptr);
    EXPECT_EQ(rt, nullptr);
  }
}
