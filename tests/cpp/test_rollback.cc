// Runtime::rollback (model/state_undo.h): a sequence fed a prefix, then n = k + r tokens undoably,
// then rolled back by r, holds bitwise the slot state of a sequence fed only the k kept tokens
// (window rings, pending compressor rows, Engram history), holds exactly the pages its length
// needs, and continues with bitwise the logits of a fresh sequence fed the same tokens in one
// chunk. Lengths cross compression groups (ratio 2), pages (64 and 4 positions), the window ring
// (tiny-v41: sliding_window 8) and the Engram history (3 ids). Bad input is refused by name.
// Needs DSV41RT_TEST_CHECKPOINT (tiny-v41).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "direct_sequence_test_util.h"
#include "dsv41rt/runtime.hpp"
#include "rollback_test_util.h"

namespace {

using dsv41rt::Runtime;
using dsv41rt::RuntimeOptions;
using dsv41rt::StatusCode;
using dsv41rt::testing::code_of;
using dsv41rt::testing::run;
using dsv41rt::testing::slice;
using dsv41rt::testing::slot_state;
using dsv41rt::testing::tokens;
using Case = dsv41rt::testing::RollbackCase;

const char* checkpoint() { return dsv41rt::testing::tiny_checkpoint(); }
constexpr int64_t kWindow = 8;  // tiny-v41's sliding_window: longer forwards go back only whole

RuntimeOptions options(int64_t page_size) {
  RuntimeOptions o;
  o.checkpoint = checkpoint();
  o.pool.kv_memory = 64 << 20;
  o.pool.max_num_seqs = 8;
  o.pool.page_size = page_size;
  o.engine_thread = false;
  return o;
}

// One case on `rt` over the text `text`: see the file comment.
void check_case(Runtime& rt, const std::vector<int32_t>& text, const Case& cs) {
  SCOPED_TRACE(cs.name());
  const int64_t seq = rt.open_sequence();
  if (cs.a > 0) run(rt, seq, slice(text, 0, cs.a), false);
  dsv41rt::testing::feed_and_roll_back(rt, seq, text, cs, kWindow, 129000u);
  dsv41rt::testing::expect_continues_as_fresh(rt, seq, text, cs);
  rt.close_sequence(seq);
}

}  // namespace

// The slot bytes after a rollback equal those of the same sequence before its undoable forward
// (whole rollback) or of a copy fed only the kept tokens (partial rollback).
TEST(Rollback, SlotStateIsBitwiseTheShorterSequences) {
  NEED_CHECKPOINT();
  Runtime rt(options(64));
  const std::vector<int32_t> text = tokens(200, 1);
  for (const Case& cs : std::vector<Case>{{0, 0, 5, 0},
                                          {5, 2, 3, 0},
                                          {6, 1, 4, 0},
                                          {7, 0, 1, 0},
                                          {13, 5, 3, 0},
                                          {62, 1, 4, 0},
                                          {60, 0, 20, 0},
                                          {20, 4, 2, 0, 3}}) {
    SCOPED_TRACE(cs.name());
    const int64_t base = rt.open_sequence();
    if (cs.a > 0) run(rt, base, slice(text, 0, cs.a), false);
    // Both start from the same slot bytes: copies of `base`.
    const int64_t seq = rt.fork(base), twin = rt.fork(base);
    const std::vector<uint8_t> before = slot_state(rt, seq);
    std::vector<int32_t> fed = slice(text, cs.a, cs.k);
    const std::vector<int32_t> other = tokens(cs.r, 99);
    fed.insert(fed.end(), other.begin(), other.end());
    run(rt, seq, fed, false, true);
    EXPECT_NE(slot_state(rt, seq), before);
    rt.rollback(seq, cs.r);
    if (cs.r2 > 0) rt.rollback(seq, cs.r2);
    rt.check_invariants();
    const int64_t kept = cs.k - cs.r2;
    if (kept > 0) run(rt, twin, slice(text, cs.a, kept), false);
    EXPECT_TRUE(slot_state(rt, seq) == slot_state(rt, twin));
    if (kept == 0) {
      EXPECT_TRUE(slot_state(rt, seq) == before);
    }
    for (const int64_t s : {base, seq, twin}) rt.close_sequence(s);
  }
  EXPECT_EQ(rt.stats().pool.pages_used, 0);
  EXPECT_EQ(rt.stats().pool.slots_used, 0);
}

TEST(Rollback, ContinuesBitwiseAsAFreshSequence) {
  NEED_CHECKPOINT();
  Runtime rt(options(64));
  const std::vector<int32_t> text = tokens(200, 2);
  // Compression groups (ratio 2: a, a + k odd / even, the pending row from before the forward or
  // from it), the window ring (8 rows: wrapping, n = 8, n > 8 undone whole), Engram (r >= 3),
  // pages of 64 (crossed by the forward, by the rollback, exactly at a boundary), a forward at
  // length 0, two rollbacks in a row.
  for (const Case& cs : std::vector<Case>{{0, 0, 5, 3},
                                          {0, 3, 4, 2},
                                          {5, 1, 1, 2},
                                          {5, 2, 3, 3},
                                          {6, 1, 4, 2},
                                          {7, 0, 1, 2},
                                          {7, 0, 8, 2},
                                          {13, 5, 3, 3},
                                          {30, 2, 6, 4},
                                          {62, 1, 4, 3},
                                          {63, 2, 5, 2},
                                          {64, 0, 3, 2},
                                          {60, 0, 20, 4},
                                          {127, 4, 4, 3},
                                          {21, 5, 2, 3, 2}}) {
    check_case(rt, text, cs);
  }
  EXPECT_EQ(rt.stats().pool.pages_used, 0);
}

TEST(Rollback, SmallPagesAreGivenBack) {
  NEED_CHECKPOINT();
  Runtime rt(options(4));
  const std::vector<int32_t> text = tokens(80, 3);
  for (const Case& cs : std::vector<Case>{
           {3, 2, 6, 3}, {8, 0, 8, 2}, {9, 3, 4, 5}, {40, 0, 17, 3}, {11, 6, 2, 2, 5}}) {
    check_case(rt, text, cs);
  }
  EXPECT_EQ(rt.stats().pool.pages_used, 0);
}

TEST(Rollback, BadRequestsAreRefusedByName) {
  NEED_CHECKPOINT();
  Runtime rt(options(64));
  const std::vector<int32_t> text = tokens(40, 4);
  const int64_t seq = rt.open_sequence();
  EXPECT_EQ(code_of([&] { rt.rollback(seq + 100, 1); }), StatusCode::kNotFound);
  EXPECT_EQ(code_of([&] { rt.rollback_limit(seq + 100); }), StatusCode::kNotFound);
  EXPECT_EQ(code_of([&] { rt.rollback(seq, 1); }), StatusCode::kOutOfRange);  // nothing recorded
  run(rt, seq, slice(text, 0, 10), false);                                    // not undoable
  EXPECT_EQ(rt.rollback_limit(seq), 0);
  EXPECT_EQ(code_of([&] { rt.rollback(seq, 1); }), StatusCode::kOutOfRange);
  run(rt, seq, slice(text, 10, 5), false, true);
  EXPECT_EQ(code_of([&] { rt.rollback(seq, -1); }), StatusCode::kInvalidArgument);
  EXPECT_EQ(code_of([&] { rt.rollback(seq, 6); }), StatusCode::kOutOfRange);  // 5 were fed
  rt.rollback(seq, 0);                                                        // a no-op
  rt.rollback(seq, 2);
  EXPECT_EQ(code_of([&] { rt.rollback(seq, 4); }), StatusCode::kOutOfRange);  // 3 are left
  // A decode replaces the record.
  std::vector<float> logits(size_t(rt.info().vocab_size));
  rt.decode({seq}, &text[13], logits.data());
  EXPECT_EQ(code_of([&] { rt.rollback(seq, 1); }), StatusCode::kOutOfRange);
  // A forward longer than the window (8) goes back only as a whole.
  run(rt, seq, slice(text, 14, 12), false, true);
  EXPECT_EQ(code_of([&] { rt.rollback(seq, 5); }), StatusCode::kOutOfRange);
  try {
    rt.rollback(seq, 5);
  } catch (const dsv41rt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("only all of them"), std::string::npos) << e.what();
  }
  // The refused calls changed nothing: the state still continues as a fresh sequence's.
  rt.check_invariants();
  rt.rollback(seq, 12);
  const std::vector<float> after = run(rt, seq, slice(text, 14, 3), true);
  const int64_t fresh = rt.open_sequence();
  run(rt, fresh, slice(text, 0, 14), false);
  EXPECT_TRUE(after == run(rt, fresh, slice(text, 14, 3), true));
  // A fork does not inherit the record.
  run(rt, seq, slice(text, 17, 3), false, true);
  const int64_t copy = rt.fork(seq);
  EXPECT_EQ(rt.rollback_limit(copy), 0);
  EXPECT_EQ(rt.rollback_limit(seq), 3);
  rt.check_invariants();
}
