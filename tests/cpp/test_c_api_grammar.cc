// Grammar-constrained decoding through the C API (dsv41rt_set_grammar_vocab, the grammar fields of
// dsv41rt_request_params) on the tiny checkpoint (DSV41RT_TEST_CHECKPOINT), with a synthetic
// vocabulary (token 1 the stop token, 32..126 printable ASCII, every other id a control token):
// sampled outputs of the random model satisfy the schema; a grammar without a vocabulary, an
// unknown kind and bad vocabulary arguments are E_INVALID_ARGUMENT with a message naming them; the
// 0.1.0 request layout (ending before the grammar fields) still submits, unconstrained.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/json.h"
#include "dsv41rt/dsv41rt.h"
#include "runtime/engine/grammar.h"

namespace {

const char* checkpoint() { return std::getenv("DSV41RT_TEST_CHECKPOINT"); }

class CApiGrammar : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!checkpoint()) GTEST_SKIP() << "set DSV41RT_TEST_CHECKPOINT to a tiny-v41 checkpoint";
    dsv41rt_runtime_params p;
    dsv41rt_runtime_default_params(&p);
    p.checkpoint_dir = checkpoint();
    p.max_num_seqs = 4;
    ASSERT_EQ(dsv41rt_runtime_create(DSV41RT_ABI_VERSION, &p, &rt_), DSV41RT_OK)
        << dsv41rt_last_error(nullptr);
    for (int c = 0; c < 127; ++c) tokens_.push_back(c >= 32 ? std::string(1, char(c)) : "");
  }
  void TearDown() override {
    if (rt_) {
      EXPECT_EQ(dsv41rt_runtime_destroy(rt_), DSV41RT_OK);
    }
  }
  dsv41rt_status set_vocab() {
    std::vector<const char*> ptrs;
    std::vector<size_t> lens;
    for (const std::string& t : tokens_) ptrs.push_back(t.data()), lens.push_back(t.size());
    const int32_t stop = 1;
    return dsv41rt_set_grammar_vocab(rt_, ptrs.data(), lens.data(), ptrs.size(), &stop, 1);
  }
  // The tokens of request `id` until it finishes.
  std::vector<int32_t> drain(int64_t id) {
    std::vector<int32_t> out;
    int32_t buf[64];
    size_t n = 0;
    int fin = 0;
    while (!fin) {
      EXPECT_EQ(dsv41rt_wait(rt_, id, 60000, buf, 64, &n, &fin), DSV41RT_OK)
          << dsv41rt_last_error(rt_);
      out.insert(out.end(), buf, buf + n);
    }
    return out;
  }
  dsv41rt_runtime* rt_ = nullptr;
  std::vector<std::string> tokens_;
};

const std::vector<int32_t> kPrompt = {0, 671, 6102, 13462};
const char* kSchema =
    R"({"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99},
        "ok": {"type": "boolean"}}, "required": ["n", "ok"], "additionalProperties": false})";

TEST_F(CApiGrammar, SampledOutputsSatisfyTheSchema) {
  if (!dsv41rt::engine::GrammarVocab::available()) GTEST_SKIP() << "built without xgrammar";
  ASSERT_EQ(set_vocab(), DSV41RT_OK) << dsv41rt_last_error(rt_);
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    dsv41rt_request_params rp;
    dsv41rt_request_default_params(&rp);
    rp.max_new_tokens = 200;
    rp.sampling.temperature = 1.0f, rp.sampling.seed = seed;
    rp.grammar_kind = "json_schema";
    rp.grammar_text = kSchema;
    int64_t id = 0;
    ASSERT_EQ(dsv41rt_submit(rt_, kPrompt.data(), kPrompt.size(), &rp, &id), DSV41RT_OK)
        << dsv41rt_last_error(rt_);
    const std::vector<int32_t> out = drain(id);
    ASSERT_FALSE(out.empty());
    EXPECT_EQ(out.back(), 1) << "ends with the stop token";
    std::string text;
    for (size_t i = 0; i + 1 < out.size(); ++i) text += tokens_.at(size_t(out[i]));
    const dsv41rt::Json j = dsv41rt::json_parse(text);
    EXPECT_TRUE(j.at("ok").is_bool()) << text;
    EXPECT_GE(j.at("n").as_int(), 0);
    EXPECT_LE(j.at("n").as_int(), 99);
  }
}

TEST_F(CApiGrammar, ErrorsAndTheOldLayout) {
  dsv41rt_request_params rp;
  dsv41rt_request_default_params(&rp);
  EXPECT_EQ(rp.grammar_kind, nullptr);
  EXPECT_EQ(rp.grammar_start_token, -1);
  rp.grammar_kind = "json_object";
  int64_t id = 0;
  EXPECT_EQ(dsv41rt_submit(rt_, kPrompt.data(), kPrompt.size(), &rp, &id),
            DSV41RT_E_INVALID_ARGUMENT);
  EXPECT_NE(std::string(dsv41rt_last_error(rt_)).find("grammar"), std::string::npos)
      << dsv41rt_last_error(rt_);
  size_t len = 1;
  EXPECT_EQ(dsv41rt_set_grammar_vocab(rt_, nullptr, &len, 1, nullptr, 0),
            DSV41RT_E_INVALID_ARGUMENT);
  if (dsv41rt::engine::GrammarVocab::available()) {
    ASSERT_EQ(set_vocab(), DSV41RT_OK) << dsv41rt_last_error(rt_);
    rp.grammar_kind = "toml";
    EXPECT_EQ(dsv41rt_submit(rt_, kPrompt.data(), kPrompt.size(), &rp, &id),
              DSV41RT_E_INVALID_ARGUMENT);
    EXPECT_NE(std::string(dsv41rt_last_error(rt_)).find("grammar kind 'toml'"), std::string::npos);
  }
  // The 0.1.0 layout: no grammar fields, whatever follows them in memory.
  rp.struct_size = uint32_t(offsetof(dsv41rt_request_params, grammar_kind));
  rp.max_new_tokens = 2;
  ASSERT_EQ(dsv41rt_submit(rt_, kPrompt.data(), kPrompt.size(), &rp, &id), DSV41RT_OK)
      << dsv41rt_last_error(rt_);
  EXPECT_EQ(drain(id).size(), 2u);
}

}  // namespace
