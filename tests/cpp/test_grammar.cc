// Grammar-constrained decoding (runtime/engine/grammar.h), on a synthetic vocabulary: token 1 is
// the stop token, tokens 32..126 the printable ASCII characters, a few multi-character tokens,
// every other id a control token (""):
//   - the matcher alone: random walks over the allowed tokens always end in a complete output
//     that parses as JSON and satisfies the schema (20 seeds); a late start (start_token /
//     start_within) leaves the output free, then forces the start token, then holds the grammar;
//     bad kinds, schemas and vocabularies are Errors naming what is wrong;
//   - through the Runtime on the tiny checkpoint, on every backend (cpu; cuda in CUDA builds):
//     sampled outputs of the random model satisfy the schema and end with kStop; a grammar
//     without a vocabulary, or a bad one, is refused at submit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iterator>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "backend_test_util.h"
#include "core/json.h"
#include "core/status.h"
#include "dsv41rt/runtime.hpp"
#include "kernels/sampling.h"
#include "runtime/engine/grammar.h"

namespace dsv41rt::engine {
namespace {

constexpr int32_t kStop = 1;
const char* kSchema =
    R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "boolean"},
        "c": {"enum": ["x", "y"]}}, "required": ["a", "b", "c"], "additionalProperties": false})";

std::vector<std::string> synthetic_tokens(int64_t V) {
  std::vector<std::string> t(size_t(std::min<int64_t>(V, 200)));
  for (int c = 32; c < 127; ++c) t[size_t(c)] = std::string(1, char(c));
  const char* multi[] = {"{\"", "\":", "true", "false", "\"x\"", "\"y\"", "12", ",\""};
  for (size_t i = 0; i < std::size(multi); ++i) t[130 + i] = multi[i];
  return t;
}

bool allowed(const std::vector<uint32_t>& w, int32_t t) { return (w[size_t(t / 32)] >> (t % 32)) & 1u; }

void expect_schema(const std::string& text) {
  SCOPED_TRACE(text);
  const Json j = json_parse(text);
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j.size(), 3u);
  // JSON Schema integers are unbounded: a long one parses as a double, still integral.
  const Json& a = j.at("a");
  EXPECT_TRUE(a.is_int() || (a.is_number() && std::floor(a.as_double()) == a.as_double()));
  EXPECT_TRUE(j.at("b").is_bool());
  const std::string c = j.at("c").as_string();
  EXPECT_TRUE(c == "x" || c == "y");
}

GrammarParams schema_grammar() {
  GrammarParams g;
  g.kind = "json_schema";
  g.text = kSchema;
  return g;
}

TEST(Grammar, RandomWalksEndInOutputsOfTheSchema) {
  if (!GrammarVocab::available()) GTEST_SKIP() << "built without xgrammar";
  const int64_t V = 300;
  const std::vector<std::string> tokens = synthetic_tokens(V);
  const GrammarVocab vocab(tokens, V, {kStop});
  for (uint32_t seed = 0; seed < 20; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    auto g = vocab.compile(schema_grammar());
    std::vector<uint32_t> words(size_t(kernels::token_mask_words(V)));
    std::string text;
    int64_t n = 0;
    for (; n < 2000 && !g->terminated(); ++n) {
      ASSERT_TRUE(g->next_mask(words.data(), n));
      std::vector<int32_t> ok;
      for (int32_t t = 0; t < V; ++t) {
        if (allowed(words, t)) ok.push_back(t);
      }
      ASSERT_FALSE(ok.empty());
      for (int32_t t : ok) ASSERT_TRUE(t == kStop || !tokens[size_t(t)].empty()) << t;
      const int32_t t = ok[std::uniform_int_distribution<size_t>(0, ok.size() - 1)(rng)];
      ASSERT_TRUE(g->accept(t));
      if (t != kStop) text += tokens[size_t(t)];
    }
    ASSERT_TRUE(g->terminated()) << text;
    expect_schema(text);
  }
}

TEST(Grammar, StartsAfterItsStartTokenAndForcesIt) {
  if (!GrammarVocab::available()) GTEST_SKIP() << "built without xgrammar";
  const int64_t V = 300;
  const GrammarVocab vocab(synthetic_tokens(V), V, {kStop});
  GrammarParams p;
  p.kind = "json_object";
  p.start_token = 5, p.start_within = 3;
  auto g = vocab.compile(p);
  std::vector<uint32_t> words(size_t(kernels::token_mask_words(V)), 0xABCDu);
  for (int64_t n = 0; n < 3; ++n) {  // free: no mask, anything taken
    EXPECT_FALSE(g->next_mask(words.data(), n));
    EXPECT_TRUE(g->accept(int32_t('z')));
  }
  EXPECT_EQ(words[0], 0xABCDu);  // untouched
  ASSERT_TRUE(g->next_mask(words.data(), 3));  // the budget is spent: only the start token
  for (int32_t t = 0; t < V; ++t) EXPECT_EQ(allowed(words, t), t == 5) << t;
  EXPECT_TRUE(g->accept(5));
  EXPECT_FALSE(g->terminated());
  ASSERT_TRUE(g->next_mask(words.data(), 4));  // held: a compact object starts with '{'
  EXPECT_TRUE(allowed(words, '{'));
  EXPECT_FALSE(allowed(words, 'z'));
  EXPECT_FALSE(allowed(words, kStop));
  EXPECT_FALSE(g->accept('z'));
}

TEST(Grammar, ErrorsNameWhatIsWrong) {
  if (!GrammarVocab::available()) {
    EXPECT_THROW(GrammarVocab(synthetic_tokens(300), 300, {kStop}), Error);
    return;
  }
  const GrammarVocab vocab(synthetic_tokens(300), 300, {kStop});
  auto message = [&](GrammarParams p) -> std::string {
    try {
      vocab.compile(p);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  GrammarParams p;
  p.kind = "xml";
  EXPECT_NE(message(p).find("grammar kind 'xml' is not one of"), std::string::npos);
  p.kind = "json_schema", p.text = "{not json";
  EXPECT_NE(message(p).find("grammar (json_schema)"), std::string::npos);
  p.kind = "ebnf", p.text = "root ::= undefined_rule";
  EXPECT_NE(message(p).find("grammar (ebnf)"), std::string::npos);
  p.kind = "json_object", p.start_token = 300;
  EXPECT_NE(message(p).find("start_token 300"), std::string::npos);
  p.start_token = -1, p.start_within = 4;
  EXPECT_NE(message(p).find("start_within needs a start_token"), std::string::npos);
  EXPECT_THROW(GrammarVocab(synthetic_tokens(300), 300, {300}), Error);
  EXPECT_THROW(GrammarVocab(synthetic_tokens(300), 100, {kStop}), Error);
}

// ---- through the Runtime on the tiny checkpoint ------------------------------------------------

const char* checkpoint() { return std::getenv("DSV41RT_TEST_CHECKPOINT"); }

class GrammarRuntime : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "cuda") DSV41RT_SKIP_WITHOUT_CUDA();
    if (!checkpoint()) GTEST_SKIP() << "set DSV41RT_TEST_CHECKPOINT to a tiny-v41 checkpoint";
    if (!GrammarVocab::available()) GTEST_SKIP() << "built without xgrammar";
  }
  Runtime make() {
    RuntimeOptions o;
    o.checkpoint = checkpoint();
    o.pool.kv_memory = 64 << 20;
    o.pool.max_num_seqs = 4;
    o.device.device = GetParam();
    o.engine_thread = false;
    return Runtime(o);
  }
};

TEST_P(GrammarRuntime, SampledOutputsOfTheRandomModelSatisfyTheSchema) {
  Runtime rt = make();
  const int64_t V = rt.info().vocab_size;
  const std::vector<std::string> tokens = synthetic_tokens(V);
  rt.set_grammar_vocab(tokens, {kStop});
  std::vector<int64_t> ids;
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    RequestParams p;
    p.max_new_tokens = 400;
    p.sampling.temperature = 1.0f, p.sampling.seed = seed;
    p.grammar = GrammarParams{"json_schema", kSchema, -1, -1};
    ids.push_back(rt.submit({0, 671, 6102, int32_t(13462 + seed)}, p));
  }
  std::map<int64_t, std::string> text;
  std::map<int64_t, FinishReason> reason;
  while (!rt.idle()) {
    for (const RequestOutput& o : rt.step()) {
      for (int32_t t : o.tokens) {
        ASSERT_TRUE(t == kStop || (t < int32_t(tokens.size()) && !tokens[size_t(t)].empty())) << t;
        if (t != kStop) text[o.id] += tokens[size_t(t)];
      }
      if (o.finished) reason[o.id] = o.reason;
    }
  }
  for (int64_t id : ids) {
    EXPECT_EQ(reason[id], FinishReason::kStop) << text[id];
    expect_schema(text[id]);
  }
}

TEST_P(GrammarRuntime, RefusedAtSubmitWithoutAVocabularyOrWithABadGrammar) {
  Runtime rt = make();
  RequestParams p;
  p.grammar = GrammarParams{"json_object", "", -1, -1};
  try {
    rt.submit({0, 1, 2}, p);
    FAIL() << "submitted without a vocabulary";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("set_grammar_vocab"), std::string::npos) << e.what();
  }
  rt.set_grammar_vocab(synthetic_tokens(rt.info().vocab_size), {kStop});
  p.grammar = GrammarParams{"json_schema", "{\"type\": \"nonsense\"}", -1, -1};
  EXPECT_THROW(rt.submit({0, 1, 2}, p), Error);
  EXPECT_TRUE(rt.idle());
}

INSTANTIATE_TEST_SUITE_P(Backends, GrammarRuntime,
                         ::testing::ValuesIn(::dsv41rt::testing::backend_names()),
                         ::dsv41rt::testing::BackendName());

}  // namespace
}  // namespace dsv41rt::engine
