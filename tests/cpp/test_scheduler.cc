// Scheduler: FIFO admission, token budget split, chunked prefill, samples flag, immediate freeing,
// submit errors, preemption (victim choice, re-queue at the front, recompute), an exhaustion run
// against a deterministic mock model, and a randomized stress test of the pool accounting.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/status.h"
#include "runtime/engine/scheduler.h"
#include "runtime/model/kv_pool.h"

namespace dsv41rt::engine {
namespace {

std::vector<int32_t> make_prompt(int64_t n, int32_t base) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) p[size_t(i)] = base + int32_t(i % 1000);
  return p;
}

// The "model": the next token is a hash of every token in the (simulated) cache, so it depends
// only on the sequence, never on batching, chunking or preemption.
int32_t next_token(const std::vector<int32_t>& seq) {
  uint64_t h = 1469598103934665603ull;
  for (int32_t t : seq) {
    h ^= uint32_t(t);
    h *= 1099511628211ull;
  }
  return int32_t((h >> 17) % 50000);
}

std::vector<int32_t> reference_output(std::vector<int32_t> seq, int64_t max_new) {
  for (int64_t i = 0; i < max_new; ++i) seq.push_back(next_token(seq));
  return seq;
}

// Runs plans like an engine: keeps a per-request "cache" of computed tokens, checks each chunk
// continues it and that the request holds the slot and pages the chunk needs.
struct MockModel {
  std::map<int64_t, std::vector<int32_t>> cache;

  // Returns the sampled (request id, token) pairs of the step.
  std::vector<std::pair<int64_t, int32_t>> run(const Scheduler& s, const KvPool& pool,
                                               const StepPlan& plan) {
    for (int64_t id : plan.preempted) cache.erase(id);
    std::vector<std::pair<int64_t, int32_t>> out;
    std::set<int64_t> in_plan;
    for (const ScheduledChunk& c : plan.chunks) {
      EXPECT_TRUE(in_plan.insert(c.request_id).second) << "request twice in one step";
      EXPECT_EQ(std::count(plan.preempted.begin(), plan.preempted.end(), c.request_id), 0);
      const SchedRequest& r = s.request(c.request_id);
      EXPECT_TRUE(r.running);
      EXPECT_GE(r.slot, 0);
      EXPECT_GE(int64_t(r.pages.size()), pool.pages_for(c.start + c.count));
      EXPECT_GE(c.count, 1);
      std::vector<int32_t>& kv = cache[c.request_id];
      EXPECT_EQ(int64_t(kv.size()), c.start) << "chunk does not continue the cached prefix";
      EXPECT_EQ(c.samples, c.start + c.count == int64_t(r.tokens.size()));
      kv.insert(kv.end(), r.tokens.begin() + c.start, r.tokens.begin() + c.start + c.count);
      if (c.samples) out.emplace_back(c.request_id, next_token(kv));
    }
    return out;
  }
};

int64_t plan_tokens(const StepPlan& p) {
  int64_t n = 0;
  for (const auto& c : p.chunks) n += c.count;
  return n;
}

void expect_chunk(const ScheduledChunk& c, int64_t id, int64_t start, int64_t count, bool samples) {
  EXPECT_EQ(c.request_id, id);
  EXPECT_EQ(c.start, start);
  EXPECT_EQ(c.count, count);
  EXPECT_EQ(c.samples, samples);
}

TEST(Scheduler, IdsStartAtOneAndIdleWhenEmpty) {
  KvPool pool(model::PoolGeometry{4, 0, 0}, 16, 4);
  Scheduler s({}, pool);
  EXPECT_TRUE(s.idle());
  EXPECT_TRUE(s.schedule().chunks.empty());
  EXPECT_EQ(s.config().max_model_len, 64);  // 0 resolves to the pool capacity in tokens
  EXPECT_EQ(s.submit(make_prompt(3, 1), 2), 1);
  EXPECT_EQ(s.submit(make_prompt(3, 1), 2), 2);
  EXPECT_FALSE(s.idle());
  EXPECT_TRUE(s.has_request(2));
  EXPECT_FALSE(s.has_request(3));
  EXPECT_EQ(s.request(1).prompt_len, 3);
  EXPECT_FALSE(s.request(1).running);
}

TEST(Scheduler, FifoAdmissionLimitedBySlots) {
  KvPool pool(model::PoolGeometry{4, 0, 0}, 16, 2);
  Scheduler s({.max_num_seqs = 8, .max_num_batched_tokens = 100}, pool);
  const int64_t a = s.submit(make_prompt(5, 1), 4);
  const int64_t b = s.submit(make_prompt(6, 1), 4);
  const int64_t c = s.submit(make_prompt(7, 1), 4);
  StepPlan p = s.schedule();
  ASSERT_EQ(p.chunks.size(), 2u);
  expect_chunk(p.chunks[0], a, 0, 5, true);
  expect_chunk(p.chunks[1], b, 0, 6, true);
  EXPECT_EQ(s.request(a).admit_seq, 0);
  EXPECT_EQ(s.request(b).admit_seq, 1);
  EXPECT_FALSE(s.request(c).running);
  EXPECT_EQ(s.stats().waiting, 1);
  EXPECT_EQ(s.stats().running, 2);
  EXPECT_EQ(s.stats().max_waiting_seen, 3);
  s.check_invariants();
  s.complete(p);
  EXPECT_EQ(s.request(a).computed, 5);
  s.append_token(a, 11);
  s.append_token(b, 12);
  s.finish(a, FinishReason::kStop);
  p = s.schedule();
  ASSERT_EQ(p.chunks.size(), 2u);
  expect_chunk(p.chunks[0], b, 6, 1, true);  // decode first
  expect_chunk(p.chunks[1], c, 0, 7, true);  // then the admission
  s.check_invariants();
}

TEST(Scheduler, MaxRunningLimitsAdmission) {
  KvPool pool(model::PoolGeometry{4, 0, 0}, 16, 4);
  Scheduler s({.max_num_seqs = 1, .max_num_batched_tokens = 100}, pool);
  s.submit(make_prompt(2, 1), 2);
  s.submit(make_prompt(2, 1), 2);
  EXPECT_EQ(s.schedule().chunks.size(), 1u);
  EXPECT_EQ(s.stats().running, 1);
}

TEST(Scheduler, AdmissionNeverSkipsTheQueueHead) {
  // 4 pages of 4 tokens. The head needs 3 pages but only 1 is free: the small request behind it
  // would fit but must wait too.
  KvPool pool(model::PoolGeometry{4, 0, 0}, 4, 4);
  Scheduler s({.max_num_seqs = 4, .max_num_batched_tokens = 100}, pool);
  const int64_t a = s.submit(make_prompt(8, 1), 2);
  StepPlan p = s.schedule();
  ASSERT_EQ(p.chunks.size(), 1u);  // a holds 2 pages
  s.complete(p);
  s.append_token(a, 9);
  const int64_t big = s.submit(make_prompt(10, 1), 2);
  const int64_t small = s.submit(make_prompt(1, 1), 2);
  p = s.schedule();  // a's decode takes a third page; big needs 3 of the 1 left; small must wait
  ASSERT_EQ(p.chunks.size(), 1u);
  expect_chunk(p.chunks[0], a, 8, 1, true);
  EXPECT_EQ(pool.free_page_count(), 1);
  EXPECT_FALSE(s.request(big).running);
  EXPECT_FALSE(s.request(small).running);
  s.check_invariants();
}

TEST(Scheduler, TokenBudgetSplitsDecodesAndChunkedPrefill) {
  KvPool pool(model::PoolGeometry{4, 0, 0}, 64, 8);
  Scheduler s({.max_num_seqs = 8, .max_num_batched_tokens = 8}, pool);
  const int64_t a = s.submit(make_prompt(3, 1), 10);
  const int64_t b = s.submit(make_prompt(3, 1), 10);
  StepPlan p = s.schedule();
  ASSERT_EQ(p.chunks.size(), 2u);
  expect_chunk(p.chunks[0], a, 0, 3, true);
  expect_chunk(p.chunks[1], b, 0, 3, true);
  s.complete(p);
  s.append_token(a, 100);
  s.append_token(b, 200);

  const int64_t c = s.submit(make_prompt(20, 1), 4);
  int64_t start = 0;
  int64_t decode_pos = 3;
  for (int step = 0; step < 4; ++step) {
    p = s.schedule();
    EXPECT_LE(plan_tokens(p), 8);
    ASSERT_EQ(p.chunks.size(), 3u);
    expect_chunk(p.chunks[0], a, decode_pos, 1, true);  // decodes first, admission order
    expect_chunk(p.chunks[1], b, decode_pos, 1, true);
    const int64_t count = std::min<int64_t>(6, 20 - start);
    expect_chunk(p.chunks[2], c, start, count, start + count == 20);  // the mixed step
    s.complete(p);
    s.append_token(a, 101 + step);
    s.append_token(b, 201 + step);
    start += count;
    ++decode_pos;
    s.check_invariants();
  }
  EXPECT_EQ(start, 20);
  EXPECT_EQ(s.request(c).computed, 20);
  s.append_token(c, 7);
  p = s.schedule();
  ASSERT_EQ(p.chunks.size(), 3u);
  expect_chunk(p.chunks[2], c, 20, 1, true);
}

// max_prefill_tokens_while_decoding caps the prefill tokens (running chunks and admissions
// together) of a step that has decodes, and only such a step.
TEST(Scheduler, PrefillCapWhileDecoding) {
  KvPool pool(model::PoolGeometry{4, 0, 0}, 64, 8);
  const SchedulerConfig config{
      .max_num_seqs = 8, .max_num_batched_tokens = 64, .max_prefill_tokens_while_decoding = 5};
  {
    Scheduler alone(config, pool);  // nothing decodes: the step budget alone applies
    const int64_t r = alone.submit(make_prompt(30, 1), 2);
    StepPlan p = alone.schedule();
    ASSERT_EQ(p.chunks.size(), 1u);
    expect_chunk(p.chunks[0], r, 0, 30, true);
    alone.abort(r);
  }
  Scheduler s(config, pool);
  const int64_t a = s.submit(make_prompt(3, 1), 20);
  StepPlan p = s.schedule();
  ASSERT_EQ(p.chunks.size(), 1u);
  s.complete(p);
  s.append_token(a, 100);
  const int64_t b = s.submit(make_prompt(20, 1), 4);
  const int64_t c = s.submit(make_prompt(4, 1), 4);
  for (int step = 0; step < 4; ++step) {  // b's prompt in chunks of 5 beside a's decodes; c waits
    p = s.schedule();
    ASSERT_EQ(p.chunks.size(), 2u) << "step " << step;
    expect_chunk(p.chunks[0], a, 3 + step, 1, true);
    expect_chunk(p.chunks[1], b, 5 * step, 5, step == 3);
    EXPECT_FALSE(s.request(c).running);
    s.complete(p);
    s.append_token(a, 101 + step);
    s.check_invariants();
  }
  s.append_token(b, 200);
  p = s.schedule();  // two decodes, then c admitted within the cap
  ASSERT_EQ(p.chunks.size(), 3u);
  expect_chunk(p.chunks[0], a, 7, 1, true);
  expect_chunk(p.chunks[1], b, 20, 1, true);
  expect_chunk(p.chunks[2], c, 0, 4, true);
  s.complete(p);
  s.check_invariants();
  EXPECT_THROW(Scheduler({.max_prefill_tokens_while_decoding = -1}, pool), Error);
}

TEST(Scheduler, LongPrefillIsChunkedAcrossSteps) {
  KvPool pool(model::PoolGeometry{16, 0, 0}, 64, 2);
  Scheduler s({.max_num_seqs = 2, .max_num_batched_tokens = 50}, pool);
  const int64_t a = s.submit(make_prompt(120, 1), 1);
  std::vector<int64_t> starts;
  while (s.request(a).computed < 120) {
    StepPlan p = s.schedule();
    ASSERT_EQ(p.chunks.size(), 1u);
    starts.push_back(p.chunks[0].start);
    EXPECT_EQ(p.chunks[0].samples, p.chunks[0].start + p.chunks[0].count == 120);
    EXPECT_EQ(int64_t(s.request(a).pages.size()),
              pool.pages_for(p.chunks[0].start + p.chunks[0].count));  // pages grow per chunk
    s.complete(p);
  }
  EXPECT_EQ(starts, (std::vector<int64_t>{0, 50, 100}));
}

// Issue 23 D2: a short request that arrives while a long prompt prefills is admitted at once (room
// for its whole prompt is kept from the running prefill), not after the long prefill ends; a long
// one waits its turn as before (no two long prefills side by side).
TEST(Scheduler, ShortRequestIsNotHeldBackByALongPrefill) {
  KvPool pool(model::PoolGeometry{16, 0, 0}, 64, 4);
  Scheduler s({.max_num_seqs = 4, .max_num_batched_tokens = 64}, pool);
  const int64_t a = s.submit(make_prompt(1000, 1), 1);
  StepPlan p = s.schedule();
  ASSERT_EQ(p.chunks.size(), 1u);
  expect_chunk(p.chunks[0], a, 0, 64, false);
  s.complete(p);
  const int64_t b = s.submit(make_prompt(5, 2), 1);  // short: fits in half the room
  p = s.schedule();
  ASSERT_EQ(p.chunks.size(), 2u);
  expect_chunk(p.chunks[0], a, 64, 8, false);  // a joining step is short: 1/8 of the room
  expect_chunk(p.chunks[1], b, 0, 5, true);    // its first token comes from this step
  s.complete(p);
  const int64_t c = s.submit(make_prompt(40, 3), 1);  // long: more than half the room
  p = s.schedule();
  ASSERT_EQ(p.chunks.size(), 1u);
  expect_chunk(p.chunks[0], a, 72, 64, false);  // no join: the whole room again
  EXPECT_FALSE(s.request(c).running);
  s.complete(p);
  s.check_invariants();
}

TEST(Scheduler, FinishAndAbortFreeAtOnce) {
  KvPool pool(model::PoolGeometry{4, 0, 0}, 16, 4);
  Scheduler s({.max_num_seqs = 4, .max_num_batched_tokens = 100}, pool);
  const int64_t a = s.submit(make_prompt(9, 1), 3);
  const int64_t b = s.submit(make_prompt(5, 1), 3);
  const int64_t c = s.submit(make_prompt(5, 1), 3);
  StepPlan p = s.schedule();
  ASSERT_EQ(p.chunks.size(), 3u);
  EXPECT_EQ(pool.usage().pages_used, 3 + 2 + 2);
  EXPECT_EQ(pool.usage().slots_used, 3);
  s.abort(b);  // aborted after schedule, before complete: complete() skips it
  EXPECT_EQ(pool.usage().pages_used, 5);
  EXPECT_EQ(pool.usage().slots_used, 2);
  EXPECT_FALSE(s.has_request(b));
  s.complete(p);
  s.append_token(a, 1);
  s.finish(a, FinishReason::kLength);
  EXPECT_EQ(pool.usage().pages_used, 2);
  EXPECT_EQ(pool.usage().slots_used, 1);
  EXPECT_THROW(s.request(a), Error);
  const int64_t d = s.submit(make_prompt(5, 1), 3);
  s.abort(d);  // waiting request
  EXPECT_EQ(s.stats().waiting, 0);
  s.finish(c, FinishReason::kStop);
  EXPECT_TRUE(s.idle());
  EXPECT_EQ(pool.free_page_count(), 16);
  EXPECT_EQ(pool.free_slot_count(), 4);
  const SchedulerStats st = s.stats();
  EXPECT_EQ(st.finished, 2);
  EXPECT_EQ(st.aborted, 2);
  EXPECT_EQ(st.admitted, 3);
  try {
    s.abort(d);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), StatusCode::kNotFound);
  }
  s.check_invariants();
}

TEST(Scheduler, SubmitErrors) {
  KvPool pool(model::PoolGeometry{4, 0, 0}, 16, 4);  // 64 tokens
  Scheduler s({.max_num_seqs = 4, .max_num_batched_tokens = 100, .max_model_len = 40}, pool);
  EXPECT_THROW(s.submit({}, 3), Error);
  EXPECT_THROW(s.submit(make_prompt(3, 1), 0), Error);
  EXPECT_THROW(s.submit(make_prompt(3, 1), -2), Error);
  EXPECT_EQ(s.submit(make_prompt(30, 1), 10), 1);  // exactly max_model_len
  try {
    s.submit(make_prompt(31, 1), 10);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), StatusCode::kOutOfRange);
    const std::string m = e.message();
    EXPECT_NE(m.find("31"), std::string::npos) << m;
    EXPECT_NE(m.find("41"), std::string::npos) << m;
    EXPECT_NE(m.find("max_model_len 40"), std::string::npos) << m;
  }
  // max_model_len beyond the pool: the pool is the limit.
  Scheduler big({.max_num_seqs = 4, .max_num_batched_tokens = 100, .max_model_len = 1000}, pool);
  EXPECT_EQ(big.submit(make_prompt(60, 1), 4), 1);
  try {
    big.submit(make_prompt(60, 1), 5);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), StatusCode::kOutOfRange);
    EXPECT_NE(std::string(e.message()).find("64 tokens"), std::string::npos) << e.message();
  }
  EXPECT_THROW(Scheduler({.max_num_seqs = 0}, pool), Error);
  EXPECT_THROW(Scheduler({.max_num_batched_tokens = 0}, pool), Error);
}

TEST(Scheduler, AppendTokenChecks) {
  KvPool pool(model::PoolGeometry{4, 0, 0}, 16, 4);
  Scheduler s({.max_num_seqs = 4, .max_num_batched_tokens = 4}, pool);
  const int64_t a = s.submit(make_prompt(6, 1), 1);
  EXPECT_THROW(s.append_token(a, 5), Error);  // waiting: nothing sampled
  StepPlan p = s.schedule();
  expect_chunk(p.chunks[0], a, 0, 4, false);
  s.complete(p);
  EXPECT_THROW(s.append_token(a, 5), Error);  // mid-prefill: no sample
  EXPECT_THROW(s.complete(p), Error);         // the same chunk twice
  p = s.schedule();
  expect_chunk(p.chunks[0], a, 4, 2, true);
  s.complete(p);
  s.append_token(a, 5);
  EXPECT_EQ(s.request(a).generated(), 1);
  EXPECT_THROW(s.append_token(a, 6), Error);  // max_new_tokens reached
  EXPECT_THROW(s.append_token(99, 6), Error);
}

// Pool of 4 pages x 4 tokens. A and B each hold 2 pages; when A's decode needs a third page, B (the
// most recently admitted) is preempted and goes to the front of the queue, ahead of C.
TEST(Scheduler, PreemptsMostRecentlyAdmittedAndRequeuesAtFront) {
  KvPool pool(model::PoolGeometry{4, 0, 0}, 4, 4);
  Scheduler s({.max_num_seqs = 4, .max_num_batched_tokens = 100}, pool);
  const int64_t a = s.submit(make_prompt(7, 1), 5);
  const int64_t b = s.submit(make_prompt(7, 50), 5);
  StepPlan p = s.schedule();
  ASSERT_EQ(p.chunks.size(), 2u);
  s.complete(p);
  s.append_token(a, 1000);
  s.append_token(b, 2000);  // 8 tokens each: still 2 pages after the next decode
  p = s.schedule();
  ASSERT_EQ(p.chunks.size(), 2u);
  EXPECT_TRUE(p.preempted.empty());
  s.complete(p);
  s.append_token(a, 1001);
  s.append_token(b, 2001);
  const int64_t c = s.submit(make_prompt(1, 1), 1);

  p = s.schedule();  // A's position 8 needs page 3: none free
  ASSERT_EQ(p.preempted, std::vector<int64_t>{b});
  ASSERT_EQ(p.chunks.size(), 1u);
  expect_chunk(p.chunks[0], a, 8, 1, true);
  const SchedRequest& rb = s.request(b);
  EXPECT_FALSE(rb.running);
  EXPECT_EQ(rb.computed, 0);
  EXPECT_EQ(rb.slot, -1);
  EXPECT_TRUE(rb.pages.empty());
  EXPECT_EQ(rb.preemptions, 1);
  EXPECT_EQ(rb.tokens.size(), 9u);     // generated tokens are kept
  EXPECT_FALSE(s.request(c).running);  // not admitted: B heads the queue and was just preempted
  EXPECT_EQ(s.stats().preemptions, 1);
  EXPECT_EQ(s.stats().waiting, 2);
  s.check_invariants();
  s.complete(p);
  s.append_token(a, 1002);
  s.finish(a, FinishReason::kStop);

  p = s.schedule();  // B first (front of queue), recomputing prompt + generated, then C
  ASSERT_EQ(p.chunks.size(), 2u);
  expect_chunk(p.chunks[0], b, 0, 9, true);
  expect_chunk(p.chunks[1], c, 0, 1, true);
  EXPECT_EQ(s.request(b).admit_seq, 2);
  EXPECT_EQ(s.stats().admitted, 4);
  s.check_invariants();
}

// The asker is the newest running request: it preempts nobody (only newer requests are victims)
// and gets no chunk; the older request decodes, and once it finishes the asker goes on with the
// pages it kept. (Letting the newest preempt an older one let two long requests preempt each
// other forever: the prefix-cache stress test livelocked at seed 3275109705.)
TEST(Scheduler, NewestAskerWaitsForTheOlderInsteadOfPreemptingIt) {
  KvPool pool(model::PoolGeometry{4, 0, 0}, 4, 4);
  Scheduler s({.max_num_seqs = 4, .max_num_batched_tokens = 100}, pool);
  const int64_t a = s.submit(make_prompt(6, 1), 2);  // 2 pages
  const int64_t b = s.submit(make_prompt(8, 1), 5);  // 2 pages, full
  StepPlan p = s.schedule();
  s.complete(p);
  s.append_token(a, 1);  // 7 tokens: still 2 pages
  s.append_token(b, 2);  // 9 tokens: its next decode needs page 3
  p = s.schedule();
  EXPECT_TRUE(p.preempted.empty());
  ASSERT_EQ(p.chunks.size(), 1u);
  expect_chunk(p.chunks[0], a, 6, 1, true);
  EXPECT_TRUE(s.request(b).running);
  EXPECT_EQ(s.request(b).computed, 8);
  EXPECT_EQ(s.request(b).pages.size(), 2u);
  s.check_invariants();
  s.complete(p);
  s.append_token(a, 3);
  s.finish(a, FinishReason::kLength);
  p = s.schedule();  // A's pages are free: B decodes with the state it kept
  EXPECT_TRUE(p.preempted.empty());
  ASSERT_EQ(p.chunks.size(), 1u);
  expect_chunk(p.chunks[0], b, 8, 1, true);
  EXPECT_EQ(s.stats().preemptions, 0);
  s.check_invariants();
}

// Pool for about two requests' full context; eight submitted. All finish with the tokens they
// would get alone; queueing and preemptions show in the stats.
TEST(Scheduler, ExhaustionAllFinishWithTheirOwnTokens) {
  constexpr int64_t kPageTokens = 16;
  KvPool pool(model::PoolGeometry{kPageTokens, 64, 256}, 14, 8);  // 224 tokens
  Scheduler s({.max_num_seqs = 8, .max_num_batched_tokens = 48}, pool);
  MockModel model;
  std::map<int64_t, std::vector<int32_t>> expected, got;
  std::mt19937 rng(1234);
  for (int i = 0; i < 8; ++i) {
    const int64_t plen = 30 + int64_t(rng() % 40);
    const int64_t max_new = 30 + int64_t(rng() % 30);  // <= 99 + 59 < 112 = 7 pages
    std::vector<int32_t> prompt = make_prompt(plen, 100 * i);
    const int64_t id = s.submit(prompt, max_new);
    expected[id] = reference_output(prompt, max_new);
  }
  int steps = 0;
  while (!s.idle()) {
    ASSERT_LT(++steps, 10000) << "no progress";
    StepPlan p = s.schedule();
    ASSERT_FALSE(p.chunks.empty()) << "stalled with live requests";
    ASSERT_LE(plan_tokens(p), 48);
    s.check_invariants();
    auto sampled = model.run(s, pool, p);
    s.complete(p);
    for (auto [id, tok] : sampled) {
      s.append_token(id, tok);
      const SchedRequest& r = s.request(id);
      if (r.generated() == r.max_new_tokens) {
        got[id] = r.tokens;
        s.finish(id, FinishReason::kLength);
        model.cache.erase(id);
      }
    }
    s.check_invariants();
  }
  EXPECT_EQ(got, expected);
  const SchedulerStats st = s.stats();
  EXPECT_EQ(st.finished, 8);
  EXPECT_GT(st.max_waiting_seen, 0);
  EXPECT_GT(st.preemptions, 0);
  EXPECT_EQ(st.admitted, 8 + st.preemptions);
  EXPECT_EQ(pool.free_page_count(), 14);
  EXPECT_EQ(pool.free_slot_count(), 8);
  std::printf("exhaustion: %d steps, %lld preemptions, max queue %lld\n", steps,
              (long long)st.preemptions, (long long)st.max_waiting_seen);
}

TEST(Scheduler, RandomizedStressKeepsThePoolConsistent) {
  const uint32_t seed = std::random_device{}();
  std::printf("Scheduler stress seed: %u\n", seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  auto uniform = [&](int64_t lo, int64_t hi) {  // inclusive
    return lo + int64_t(rng() % uint64_t(hi - lo + 1));
  };

  KvPool pool(model::PoolGeometry{4, 0, 0}, 48, 6);  // 192 tokens, 6 slots
  Scheduler s({.max_num_seqs = 8, .max_num_batched_tokens = 24}, pool);
  const int64_t max_model_len = s.config().max_model_len;
  MockModel model;
  std::vector<int64_t> live;
  std::map<int64_t, std::vector<int32_t>> expected;
  int64_t ops = 0, rejected = 0, finished_checked = 0, steps = 0, aborts = 0;
  auto forget = [&](int64_t id) {
    live.erase(std::find(live.begin(), live.end(), id));
    model.cache.erase(id);
    expected.erase(id);
  };
  auto step = [&](bool allow_random_stop, bool abort_in_flight) {
    StepPlan p = s.schedule();
    ++steps;
    if (!s.idle()) {
      EXPECT_FALSE(p.chunks.empty()) << "stalled with live requests";
    }
    EXPECT_LE(plan_tokens(p), 24);
    s.check_invariants();
    auto sampled = model.run(s, pool, p);
    if (abort_in_flight && !p.chunks.empty()) {  // an abort between schedule and complete
      const int64_t id = p.chunks[size_t(uniform(0, int64_t(p.chunks.size()) - 1))].request_id;
      s.abort(id);
      forget(id);
      ++aborts;
      s.check_invariants();
    }
    s.complete(p);
    for (auto [id, tok] : sampled) {
      if (!s.has_request(id)) continue;
      s.append_token(id, tok);
      const SchedRequest& r = s.request(id);
      if (r.generated() == r.max_new_tokens) {
        EXPECT_EQ(r.tokens, expected[id]);
        ++finished_checked;
        s.finish(id, FinishReason::kLength);
        forget(id);
      } else if (allow_random_stop && uniform(0, 99) < 3) {
        EXPECT_TRUE(std::equal(r.tokens.begin(), r.tokens.end(), expected[id].begin()));
        s.finish(id, FinishReason::kStop);
        forget(id);
      }
    }
  };

  const auto t0 = std::chrono::steady_clock::now();
  for (; ops < 12000; ++ops) {
    const int64_t dice = uniform(0, 99);
    if (dice < 22) {
      const int64_t plen = uniform(0, 9) < 2 ? uniform(1, max_model_len) : uniform(1, 48);
      const int64_t max_new = uniform(0, 9) < 2 ? uniform(-1, max_model_len) : uniform(1, 24);
      std::vector<int32_t> prompt = make_prompt(plen, int32_t(uniform(0, 5000)));
      if (plen + max_new > max_model_len || max_new < 1) {
        EXPECT_THROW(s.submit(prompt, max_new), Error);
        ++rejected;
      } else {
        const int64_t id = s.submit(prompt, max_new);
        live.push_back(id);
        expected[id] = reference_output(prompt, max_new);
      }
    } else if (dice < 92) {
      step(/*allow_random_stop=*/true, /*abort_in_flight=*/uniform(0, 99) < 2);
    } else if (!live.empty()) {
      const int64_t id = live[size_t(uniform(0, int64_t(live.size()) - 1))];
      s.abort(id);
      forget(id);
      ++aborts;
    }
    s.check_invariants();
    ASSERT_FALSE(::testing::Test::HasFailure()) << "after op " << ops;
  }
  // Drain: everything left runs to completion.
  int64_t drain_steps = 0;
  while (!s.idle()) {
    ASSERT_LT(++drain_steps, 100000);
    step(false, false);
    s.check_invariants();
    ASSERT_FALSE(::testing::Test::HasFailure());
  }
  EXPECT_TRUE(live.empty());
  EXPECT_EQ(pool.free_page_count(), pool.usage().pages_total);
  EXPECT_EQ(pool.free_slot_count(), pool.usage().slots_total);
  EXPECT_EQ(pool.usage().pages_used, 0);
  EXPECT_EQ(pool.usage().slots_used, 0);
  s.check_invariants();
  const SchedulerStats st = s.stats();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf(
      "stress: %lld ops, %lld steps, %lld rejected submits, %lld aborts, %lld finished "
      "(checked), %lld preemptions, max queue %lld, %.2f s\n",
      (long long)ops, (long long)steps, (long long)rejected, (long long)aborts,
      (long long)finished_checked, (long long)st.preemptions, (long long)st.max_waiting_seen, secs);
  EXPECT_GT(st.preemptions, 0);
  EXPECT_GT(finished_checked, 0);
}

}  // namespace
}  // namespace dsv41rt::engine
