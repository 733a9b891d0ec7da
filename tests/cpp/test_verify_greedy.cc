// Runtime::verify_greedy: a greedy speculative loop over any drafts gives bitwise the token
// stream of plain greedy decoding (decode_greedy, the engine's step), and leaves the sequence in
// the state plain decoding would (its next logits equal a fresh sequence's). Drafts: the true
// greedy continuation (all accepted), the continuation made wrong at index j (exactly j
// accepted), random tokens; draft lengths 0..7 (tiny-v41: sliding_window 8); prompts of 1..300
// tokens. check_invariants after every step. Needs DSV41RT_TEST_CHECKPOINT (tiny-v41).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "core/status.h"
#include "direct_sequence_test_util.h"
#include "dsv41rt/runtime.hpp"

namespace {

using dsv41rt::Runtime;
using dsv41rt::StatusCode;

using dsv41rt::testing::code_of;
const char* checkpoint() { return dsv41rt::testing::tiny_checkpoint(); }

dsv41rt::RuntimeOptions options() {
  dsv41rt::RuntimeOptions o;
  o.checkpoint = checkpoint();
  o.pool.kv_memory = 64 << 20;
  o.pool.max_num_seqs = 8;
  o.engine_thread = false;
  return o;
}

struct Lcg {
  uint32_t x;
  int32_t next() {
    x = x * 1664525u + 1013904223u;
    return int32_t(3 + (x >> 8) % 129000u);
  }
};

std::vector<int32_t> ids(int64_t n, uint32_t seed) {
  Lcg g{seed * 2654435761u + 7u};
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& v : t) v = g.next();
  return t;
}

std::vector<float> logits_of(Runtime& rt, int64_t seq, const std::vector<int32_t>& t) {
  std::vector<float> out(size_t(rt.info().vocab_size));
  rt.forward(seq, t.data(), int64_t(t.size()), false, out.data());
  return out;
}

int32_t argmax(const std::vector<float>& v) {
  return int32_t(std::max_element(v.begin(), v.end()) - v.begin());
}

// Plain greedy: the prompt's last logits, then decode_greedy steps; `n` tokens.
std::vector<int32_t> plain_greedy(Runtime& rt, const std::vector<int32_t>& prompt, int64_t n) {
  const int64_t seq = rt.open_sequence();
  std::vector<int32_t> out{argmax(logits_of(rt, seq, prompt))};
  while (int64_t(out.size()) < n) {
    int32_t next = 0;
    float logprob = 0;
    rt.decode_greedy({seq}, &out.back(), &next, &logprob);
    out.push_back(next);
  }
  rt.close_sequence(seq);
  return out;
}

enum class Draft { kOracle, kWrongAt, kRandom };

// The speculative loop with drafts of `mode`, until at least `n` tokens; checks each step's
// accepted count where the mode fixes it.
void check_speculative(Runtime& rt, const std::vector<int32_t>& prompt,
                       const std::vector<int32_t>& greedy, Draft mode, uint32_t seed) {
  const int64_t n = int64_t(greedy.size()) - 8;  // the oracle drafts read up to 7 ahead
  const int64_t V = rt.info().vocab_size;
  const int64_t seq = rt.open_sequence();
  std::vector<int32_t> stream{argmax(logits_of(rt, seq, prompt))};
  Lcg g{seed};
  for (int step = 0; int64_t(stream.size()) < n; ++step) {
    const int64_t k = int64_t(g.next() % 8), at = int64_t(stream.size());
    std::vector<int32_t> draft(greedy.begin() + at, greedy.begin() + at + k);
    int64_t want_accepted = k;
    if (mode == Draft::kWrongAt && k > 0) {
      want_accepted = int64_t(g.next()) % k;
      draft[size_t(want_accepted)] = int32_t((draft[size_t(want_accepted)] + 1) % V);
    } else if (mode == Draft::kRandom) {
      for (auto& t : draft) t = g.next();
      want_accepted = -1;  // whatever agrees
    }
    const std::vector<int32_t> out = rt.verify_greedy(seq, stream.back(), draft);
    rt.check_invariants();
    ASSERT_GE(out.size(), 1u);
    ASSERT_LE(int64_t(out.size()), k + 1);
    if (want_accepted >= 0) {
      EXPECT_EQ(int64_t(out.size()) - 1, want_accepted) << "step " << step << " k " << k;
    }
    for (size_t i = 0; i + 1 < out.size(); ++i) EXPECT_EQ(out[i], draft[i]);
    stream.insert(stream.end(), out.begin(), out.end());
  }
  const std::vector<int32_t> want(greedy.begin(), greedy.begin() + int64_t(stream.size()));
  EXPECT_EQ(stream, want);
  // The state: feeding the newest token gives a fresh sequence's logits.
  const int64_t fresh = rt.open_sequence();
  std::vector<int32_t> fed(prompt);
  fed.insert(fed.end(), stream.begin(), stream.end() - 1);
  logits_of(rt, fresh, fed);
  EXPECT_TRUE(logits_of(rt, seq, {stream.back()}) == logits_of(rt, fresh, {stream.back()}));
  rt.close_sequence(seq);
  rt.close_sequence(fresh);
}

}  // namespace

TEST(VerifyGreedy, SpeculativeLoopIsPlainGreedyBitwise) {
  NEED_CHECKPOINT();
  Runtime rt(options());
  for (const int64_t len : {1, 9, 63, 150, 300}) {
    SCOPED_TRACE("prompt of " + std::to_string(len));
    const std::vector<int32_t> prompt = ids(len, uint32_t(len));
    const std::vector<int32_t> greedy = plain_greedy(rt, prompt, 24);
    for (const Draft mode : {Draft::kOracle, Draft::kWrongAt, Draft::kRandom}) {
      SCOPED_TRACE("draft mode " + std::to_string(int(mode)));
      check_speculative(rt, prompt, greedy, mode, uint32_t(len * 3 + int(mode)));
    }
  }
  EXPECT_EQ(rt.stats().pool.pages_used, 0);
}

TEST(VerifyGreedy, BadDraftsAreRefusedBeforeAnythingRuns) {
  NEED_CHECKPOINT();
  Runtime rt(options());
  const std::vector<int32_t> prompt = ids(20, 5);
  const int64_t seq = rt.open_sequence();
  const int32_t first = argmax(logits_of(rt, seq, prompt));
  const int32_t V = int32_t(rt.info().vocab_size);
  EXPECT_EQ(code_of([&] { rt.verify_greedy(seq + 50, first, {1, 2}); }), StatusCode::kNotFound);
  EXPECT_EQ(code_of([&] { rt.verify_greedy(seq, first, std::vector<int32_t>(8, 5)); }),
            StatusCode::kInvalidArgument);  // 9 positions > the 8-row window
  EXPECT_EQ(code_of([&] { rt.verify_greedy(seq, first, {5, V}); }), StatusCode::kInvalidArgument);
  EXPECT_EQ(code_of([&] { rt.verify_greedy(seq, -1, {5}); }), StatusCode::kInvalidArgument);
  rt.check_invariants();
  // Nothing ran: the next step is still plain greedy's.
  const std::vector<int32_t> greedy = plain_greedy(rt, prompt, 3);
  EXPECT_EQ(rt.verify_greedy(seq, first, {greedy[1]}),
            (std::vector<int32_t>{greedy[1], greedy[2]}));
}
