// Runtime::rollback on DeepSeek-V4 slots (model/state_undo.h, state_undo_v4.cc): a sequence fed a
// prefix, then n = k + r tokens undoably, then rolled back by r (and again by r2), holds bitwise
// the slot state of a sequence fed only the kept tokens (window rings, every compressor's flat
// state: pending rows and the previous group's A-halves of each CSA / HCA compressor and each CSA
// indexer compressor), holds exactly the pages its length needs, and continues with bitwise the
// logits of a fresh sequence. Lengths land mid-group and on group boundaries of CSA (ratio 4,
// before and after its first complete group) and HCA (ratio 128), within the window ring (tiny-v4:
// sliding_window 8; longer forwards go back only whole). FP32 caches on tiny-v4
// (DSV41RT_TEST_V4_CHECKPOINT), V4's quantised caches on tiny-v4-d512
// (DSV41RT_TEST_V4_D512_CHECKPOINT). With the MTP layer loaded, undoable forwards are refused.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/status.h"
#include "direct_sequence_test_util.h"
#include "dsv41rt/runtime.hpp"
#include "rollback_test_util.h"

namespace {

using dsv41rt::KvCacheDtype;
using dsv41rt::Runtime;
using dsv41rt::RuntimeOptions;
using dsv41rt::StatusCode;
using dsv41rt::testing::code_of;
using dsv41rt::testing::run;
using dsv41rt::testing::slice;
using dsv41rt::testing::slot_state;
using Case = dsv41rt::testing::RollbackCase;

constexpr uint32_t kRange = 120000u;  // token ids below tiny-v4's vocabulary
constexpr int64_t kWindow = 8;  // tiny-v4's sliding_window: longer forwards go back only whole
std::vector<int32_t> tokens(int64_t n, uint32_t seed) {
  return dsv41rt::testing::tokens(n, seed, kRange);
}

const char* v4_checkpoint() { return std::getenv("DSV41RT_TEST_V4_CHECKPOINT"); }
const char* d512_checkpoint() { return std::getenv("DSV41RT_TEST_V4_D512_CHECKPOINT"); }

#define NEED_V4_CHECKPOINT() \
  if (!v4_checkpoint()) GTEST_SKIP() << "set DSV41RT_TEST_V4_CHECKPOINT to a tiny-v4 checkpoint"
#define NEED_D512_CHECKPOINT()                                             \
  if (!d512_checkpoint())                                                  \
  GTEST_SKIP() << "set DSV41RT_TEST_V4_D512_CHECKPOINT to a tiny-v4-d512 " \
                  "checkpoint (dsv41rt make-checkpoint --preset tiny-v4-d512)"

RuntimeOptions options(const char* checkpoint, bool quantised, bool mtp = false) {
  RuntimeOptions o;
  o.checkpoint = checkpoint;
  o.pool.kv_memory = 64 << 20;
  o.pool.max_num_seqs = 8;
  o.pool.page_size = 128;
  o.pool.enable_prefix_caching = false;
  o.numerics.kv_cache_dtype = quantised ? KvCacheDtype::kAuto : KvCacheDtype::kFloat32;
  o.load_drafter = mtp;
  o.engine_thread = false;
  return o;
}

// CSA ratio 4 (groups end at 4, 8, ...), HCA ratio 128, window 8 (n <= 8 undoes in part).
const std::vector<Case> kCases = {
    {0, 0, 5, 3},       // a whole forward at length 0
    {1, 2, 3, 2},       // target 3: before CSA's first complete group, the forward completes it
    {2, 3, 3, 3},       // target 5: group 0 from saved pending rows + the forward's
    {3, 1, 4, 2},       // target 4: exactly on the first CSA boundary
    {6, 1, 6, 3},       // target 7
    {9, 3, 4, 2},       // a > 8, target 12 on a boundary, the forward ran to 16
    {10, 4, 4, 3},      // target 14: the last complete group (8..11) was pending at 10
    {13, 6, 2, 2},      // target 19, the forward crossed two CSA groups
    {20, 5, 2, 2, 3},   // rollback 2, then 3 (target 22)
    {124, 6, 2, 3},     // HCA: target 130 across 128 (the forward ran to 132)
    {125, 3, 5, 2},     // HCA: target exactly 128
    {127, 1, 7, 2},     // HCA: target 128, the forward ran to 135
    {126, 6, 2, 2, 3},  // HCA: rollback 2 (132), then 3 (129)
    {120, 0, 16, 3},    // a forward longer than the window: only whole (to 120)
    {130, 2, 5, 2},     // after the HCA group: target 132
};

// The slot bytes after the rollback equal those of a copy fed only the kept tokens (forked from the
// same prefix, so stale bytes agree too), and the same sequence continues as a fresh one.
void check(Runtime& rt, const Case& cs) {
  SCOPED_TRACE(cs.name());
  const std::vector<int32_t> text = tokens(200, 7);
  const int64_t base = rt.open_sequence();
  if (cs.a > 0) run(rt, base, slice(text, 0, cs.a), false);
  const int64_t seq = rt.fork(base), twin = rt.fork(base);
  const std::vector<uint8_t> before = slot_state(rt, seq);
  dsv41rt::testing::feed_and_roll_back(rt, seq, text, cs, kWindow, kRange,
                                       [&] { EXPECT_NE(slot_state(rt, seq), before); });
  if (cs.kept() > 0) run(rt, twin, slice(text, cs.a, cs.kept()), false);
  EXPECT_TRUE(slot_state(rt, seq) == slot_state(rt, twin)) << "slot state differs";
  if (cs.kept() == 0) {
    EXPECT_TRUE(slot_state(rt, seq) == before);
  }
  dsv41rt::testing::expect_continues_as_fresh(rt, seq, text, cs);
  for (const int64_t s : {base, seq, twin}) rt.close_sequence(s);
}

void check_all(Runtime& rt) {
  for (const Case& cs : kCases) check(rt, cs);
  EXPECT_EQ(rt.stats().pool.pages_used, 0);
  EXPECT_EQ(rt.stats().pool.slots_used, 0);
}

}  // namespace

TEST(V4Rollback, Float32CachesRestoreBitwise) {
  NEED_V4_CHECKPOINT();
  Runtime rt(options(v4_checkpoint(), false));
  check_all(rt);
}

TEST(V4Rollback, QuantisedCachesRestoreBitwise) {
  NEED_D512_CHECKPOINT();
  Runtime rt(options(d512_checkpoint(), true));
  check_all(rt);
}

TEST(V4Rollback, RuleAndMessagesAsV41) {
  NEED_V4_CHECKPOINT();
  Runtime rt(options(v4_checkpoint(), false));
  const std::vector<int32_t> text = tokens(40, 4);
  const int64_t seq = rt.open_sequence();
  run(rt, seq, slice(text, 0, 10), false, true);  // longer than the window (8)
  EXPECT_EQ(rt.rollback_limit(seq), 10);          // only all of them
  try {
    rt.rollback(seq, 5);
    ADD_FAILURE() << "a partial rollback of a forward longer than the window was allowed";
  } catch (const dsv41rt::Error& e) {
    EXPECT_EQ(e.kind(), StatusCode::kOutOfRange);
    EXPECT_NE(std::string(e.what()).find("only all of them"), std::string::npos) << e.what();
  }
  rt.rollback(seq, 10);
  EXPECT_EQ(code_of([&] { rt.rollback(seq, 1); }), StatusCode::kOutOfRange);
  rt.close_sequence(seq);
}

// V4's MTP layer keeps a ring row made from the token after its position: refused by name.
TEST(V4Rollback, RefusedWithTheMtpLayer) {
  NEED_V4_CHECKPOINT();
  Runtime rt(options(v4_checkpoint(), false, /*mtp=*/true));
  const int64_t seq = rt.open_sequence();
  const std::vector<int32_t> t = tokens(5, 1);
  try {
    run(rt, seq, t, false, true);
    ADD_FAILURE() << "an undoable forward with the MTP layer loaded was allowed";
  } catch (const dsv41rt::Error& e) {
    EXPECT_EQ(e.kind(), StatusCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("MTP layer"), std::string::npos) << e.what();
  }
  rt.check_invariants();
  run(rt, seq, t, false);  // the sequence still runs (the refusal changed nothing)
  rt.close_sequence(seq);
}
