// Shared by the rollback suites (test_rollback.cc: V4.1, test_v4_rollback.cc: V4): token text, the
// slot bytes of a sequence, and the two halves of a case — an undoable forward rolled back (the
// limit and the pages it leaves) and the continuation compared with a fresh sequence.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "dsv41rt/runtime.hpp"
#include "runtime/sequence_state.h"

namespace dsv41rt::testing {

/// Deterministic token ids in [3, 3 + range): the text that is kept, and other ids for the
/// positions rolled back (so that undoing them matters).
inline std::vector<int32_t> tokens(int64_t n, uint32_t seed, uint32_t range = 129000u) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  uint32_t x = seed * 2654435761u + 12345u;
  for (auto& v : t) {
    x = x * 1664525u + 1013904223u;
    v = int32_t(3 + (x >> 8) % range);
  }
  return t;
}

inline std::vector<int32_t> slice(const std::vector<int32_t>& t, int64_t from, int64_t n) {
  return {t.begin() + from, t.begin() + from + n};
}

/// The slot state (window rings, pending compressor rows, Engram history) of `seq`'s exported
/// blob.
inline std::vector<uint8_t> slot_state(Runtime& rt, int64_t seq) {
  const std::vector<uint8_t> blob = rt.export_sequence(seq);
  SequenceStateHeader h{};
  std::memcpy(&h, blob.data(), sizeof h);
  const auto first = blob.begin() + std::ptrdiff_t(sizeof h);
  return {first, first + h.slot_bytes};
}

/// Feeds `t` to `seq`; the logits of every position (`all`) or of the last.
inline std::vector<float> run(Runtime& rt, int64_t seq, const std::vector<int32_t>& t, bool all,
                              bool undoable = false) {
  std::vector<float> logits(size_t((all ? int64_t(t.size()) : 1) * rt.info().vocab_size));
  rt.forward(seq, t.data(), int64_t(t.size()), all, logits.data(), undoable);
  return logits;
}

struct RollbackCase {
  int64_t a, k, r, c;  // prefix, kept of the undoable forward, rolled back, fed after
  int64_t r2 = 0;      // a second rollback right after the first (then k - r2 are kept)
  int64_t kept() const { return k - r2; }
  int64_t length() const { return a + kept(); }  // of the sequence after the rollbacks
  std::string name() const {
    return "a " + std::to_string(a) + " k " + std::to_string(k) + " r " + std::to_string(r) +
           " r2 " + std::to_string(r2) + " c " + std::to_string(c);
  }
};

/// `seq` (holding text[0, a)) is fed text[a, a + k) and r other ids undoably, then rolled back by
/// r (and r2): a whole forward can always go back, one of at most `window` positions in part; the
/// pages are those of the kept length. `after_forward` runs between the forward and the rollback.
inline void feed_and_roll_back(Runtime& rt, int64_t seq, const std::vector<int32_t>& text,
                               const RollbackCase& cs, int64_t window, uint32_t range,
                               const std::function<void()>& after_forward = {}) {
  const int64_t page = rt.stats().pool.page_size;
  auto pages_for = [&](int64_t n) { return (n + page - 1) / page; };
  const int64_t used_before = rt.stats().pool.pages_used, n = cs.k + cs.r;
  std::vector<int32_t> fed = slice(text, cs.a, cs.k);
  const std::vector<int32_t> other = tokens(cs.r, uint32_t(cs.a * 131 + cs.k * 7 + cs.r), range);
  fed.insert(fed.end(), other.begin(), other.end());
  run(rt, seq, fed, false, /*undoable=*/true);
  if (after_forward) after_forward();
  EXPECT_EQ(rt.rollback_limit(seq), n);
  rt.rollback(seq, cs.r);
  rt.check_invariants();
  if (cs.r2 > 0) {
    rt.rollback(seq, cs.r2);
    rt.check_invariants();
  }
  EXPECT_EQ(rt.rollback_limit(seq), n <= window ? cs.kept() : 0);
  EXPECT_EQ(rt.stats().pool.pages_used, used_before + pages_for(cs.length()) - pages_for(cs.a));
}

/// `seq` (rolled back to text[0, length)) continues with text[length, length + c): its logits are
/// bitwise those of a fresh sequence fed text[0, length) in one chunk, then the same c tokens.
inline void expect_continues_as_fresh(Runtime& rt, int64_t seq, const std::vector<int32_t>& text,
                                      const RollbackCase& cs) {
  const int64_t length = cs.length();
  const std::vector<float> after = run(rt, seq, slice(text, length, cs.c), true);
  const int64_t fresh = rt.open_sequence();
  if (length > 0) run(rt, fresh, slice(text, 0, length), false);
  const std::vector<float> want = run(rt, fresh, slice(text, length, cs.c), true);
  EXPECT_TRUE(after == want) << "logits after the rollback differ from a fresh sequence";
  rt.check_invariants();
  rt.close_sequence(fresh);
}

}  // namespace dsv41rt::testing
