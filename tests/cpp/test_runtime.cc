// The C++ facade (include/dsv41rt/runtime.hpp): the engine thread, awaiting, callbacks, cancel,
// manual steps, shutdown with waiters, direct sequences, options errors. The outputs are checked
// against the manual-step mode and the direct sequences (greedy argmax of forward()'s logits), so
// the threaded path cannot drift from the scripted one. Needs DSV41RT_TEST_CHECKPOINT (tiny model).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "dsv41rt/runtime.hpp"

namespace {

using namespace std::chrono_literals;
using dsv41rt::FinishReason;
using dsv41rt::RequestOutput;
using dsv41rt::Runtime;
using dsv41rt::RuntimeOptions;

const char* checkpoint() { return std::getenv("DSV41RT_TEST_CHECKPOINT"); }

#define NEED_CHECKPOINT() \
  if (!checkpoint()) GTEST_SKIP() << "set DSV41RT_TEST_CHECKPOINT to a tiny-v41 checkpoint"

RuntimeOptions options(bool engine_thread) {
  RuntimeOptions o;
  o.checkpoint = checkpoint();
  o.pool.kv_memory = 64 << 20;
  o.pool.max_num_seqs = 8;
  o.engine_thread = engine_thread;
  return o;
}

dsv41rt::RequestParams greedy(int64_t n) {
  dsv41rt::RequestParams p;
  p.max_new_tokens = n;
  p.ignore_eos = true;
  return p;
}

const std::vector<int32_t> kPrompt = {0, 671, 6102, 13462, 9, 77};

// Every token of `id`, awaited until it finishes.
std::vector<int32_t> await_all(Runtime& rt, int64_t id) {
  std::vector<int32_t> tokens;
  for (int i = 0; i < 600; ++i) {
    auto out = rt.await(id, 100ms);
    if (!out) continue;
    tokens.insert(tokens.end(), out->tokens.begin(), out->tokens.end());
    if (out->finished) return tokens;
  }
  ADD_FAILURE() << "request " << id << " did not finish";
  return tokens;
}

}  // namespace

TEST(Runtime, ThreadedEqualsManualStepsEqualsDirectGreedy) {
  NEED_CHECKPOINT();
  Runtime threaded(options(true));
  const int64_t id = threaded.submit(kPrompt, greedy(6));
  const std::vector<int32_t> got = await_all(threaded, id);
  ASSERT_EQ(got.size(), 6u);

  Runtime manual(options(false));
  const int64_t mid = manual.submit(kPrompt, greedy(6));
  std::vector<int32_t> stepped;
  bool finished = false;
  while (!manual.idle()) {
    for (const RequestOutput& o : manual.step()) {
      EXPECT_EQ(o.id, mid);
      stepped.insert(stepped.end(), o.tokens.begin(), o.tokens.end());
      finished = finished || o.finished;
      if (o.finished) {
        EXPECT_EQ(o.reason, FinishReason::kLength);
      }
    }
  }
  EXPECT_TRUE(finished);
  EXPECT_EQ(stepped, got);

  // The direct sequences: argmax of each forward's last logits.
  const int64_t V = manual.info().vocab_size;
  std::vector<float> logits(static_cast<size_t>(V));
  const int64_t seq = manual.open_sequence();
  std::vector<int32_t> direct;
  manual.forward(seq, kPrompt.data(), int64_t(kPrompt.size()), false, logits.data());
  for (int i = 0; i < 6; ++i) {
    const int32_t t = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    direct.push_back(t);
    if (i < 5) manual.forward(seq, &t, 1, false, logits.data());
  }
  manual.close_sequence(seq);
  EXPECT_EQ(direct, got);
  EXPECT_EQ(manual.stats().pool.slots_used, 0);
}

TEST(Runtime, CallbacksSeeEveryTokenAndCancelWaitsForTheLastCall) {
  NEED_CHECKPOINT();
  Runtime rt(options(true));
  std::atomic<int> tokens{0}, finals{0};
  std::atomic<int> last_reason{-1};
  const int64_t id = rt.submit(kPrompt, greedy(500), [&](const RequestOutput& o) {
    tokens += int(o.tokens.size());
    if (o.finished) {
      last_reason = int(o.reason);
      finals += 1;
    }
  });
  while (tokens.load() < 2) std::this_thread::sleep_for(1ms);
  rt.cancel(id);
  EXPECT_EQ(finals.load(), 1);  // cancel returned after the final callback
  EXPECT_EQ(last_reason.load(), int(FinishReason::kAborted));
  const dsv41rt::Stats s = rt.stats();
  EXPECT_EQ(s.pool.pages_used, 0);
  EXPECT_EQ(s.scheduler.running + s.scheduler.waiting, 0);
  EXPECT_THROW(rt.await(id, 0ms), dsv41rt::Error);  // forgotten
}

TEST(Runtime, ShutdownEndsWaitersAndRefusesNewWork) {
  NEED_CHECKPOINT();
  Runtime rt(options(true));
  const int64_t id = rt.submit(kPrompt, greedy(1000));
  std::atomic<bool> ended{false};
  std::thread waiter([&] {
    while (true) {
      auto out = rt.await(id, 10s);
      if (out && out->finished) {
        EXPECT_EQ(out->reason, FinishReason::kAborted);
        ended = true;
        return;
      }
    }
  });
  std::this_thread::sleep_for(20ms);
  rt.shutdown();
  waiter.join();
  EXPECT_TRUE(ended.load());
  try {
    rt.submit(kPrompt, greedy(1));
    FAIL() << "submit after shutdown";
  } catch (const dsv41rt::Error& e) {
    EXPECT_EQ(e.kind(), dsv41rt::StatusCode::kEngineFailed);
    EXPECT_NE(e.message().find("shut down"), std::string::npos) << e.message();
  }
  rt.shutdown();  // idempotent
}

TEST(Runtime, AwaitAnyGathersEachRequestOnce) {
  NEED_CHECKPOINT();
  Runtime rt(options(true));
  std::vector<int64_t> ids;
  for (int i = 0; i < 3; ++i) ids.push_back(rt.submit(kPrompt, greedy(4 + i)));
  std::map<int64_t, size_t> got;
  int finished = 0;
  for (int i = 0; i < 600 && finished < 3; ++i) {
    for (const RequestOutput& o : rt.await_any(100ms)) {
      got[o.id] += o.tokens.size();
      finished += o.finished;
    }
  }
  ASSERT_EQ(finished, 3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(got[ids[i]], size_t(4 + i));
  EXPECT_TRUE(rt.idle());
}

TEST(Runtime, FirstScheduledIsWhenTheFirstStepBegan) {
  NEED_CHECKPOINT();
  Runtime rt(options(true));
  const auto before = std::chrono::steady_clock::now().time_since_epoch();
  const int64_t id = rt.submit(kPrompt, greedy(1));
  std::optional<RequestOutput> out;
  while (!(out = rt.await(id, 1s))) {
  }
  const auto after = std::chrono::steady_clock::now().time_since_epoch();
  EXPECT_TRUE(out->finished);
  EXPECT_GE(out->first_scheduled_ns,
            std::chrono::duration_cast<std::chrono::nanoseconds>(before).count());
  EXPECT_LE(out->first_scheduled_ns,
            std::chrono::duration_cast<std::chrono::nanoseconds>(after).count());
}

TEST(Runtime, BadOptionsAndRequestsNameWhatIsWrong) {
  NEED_CHECKPOINT();
  auto message = [](RuntimeOptions o) -> std::string {
    try {
      Runtime rt(std::move(o));
    } catch (const dsv41rt::Error& e) {
      return e.message();
    }
    return "";
  };
  RuntimeOptions o = options(false);
  o.pool.max_num_seqs = 0;
  EXPECT_NE(message(o).find("max_num_seqs must be >= 1"), std::string::npos);
  o = options(false);
  o.pool.kv_memory = 0;
  EXPECT_NE(message(o).find("kv_memory must be positive"), std::string::npos);
  o = options(false);
  o.pool.kv_memory = 4096;  // below the scratch alone: the error says what to raise
  EXPECT_NE(message(o).find("raise kv-memory (kv_memory) to at least that"), std::string::npos);
  o = options(false);
  o.checkpoint = "/nonexistent/ck";
  EXPECT_NE(message(o).find("/nonexistent/ck"), std::string::npos);
  o = options(false);
  o.engram_tables = "/nonexistent/tables.st";
  EXPECT_NE(message(o).find("/nonexistent/tables.st"), std::string::npos);

  Runtime rt(options(false));
  EXPECT_THROW(rt.submit({}, greedy(1)), dsv41rt::Error);
  EXPECT_THROW(rt.submit({int32_t(rt.info().vocab_size)}, greedy(1)), dsv41rt::Error);
  EXPECT_THROW(rt.cancel(12345), dsv41rt::Error);
  EXPECT_THROW(rt.close_sequence(7), dsv41rt::Error);
  const int64_t id = rt.submit(kPrompt, greedy(2));
  EXPECT_THROW(rt.await(id, 0ms).value(), std::bad_optional_access);  // nothing before a step
  rt.cancel(id);
  const auto outs = rt.step();
  ASSERT_EQ(outs.size(), 1u);
  EXPECT_EQ(outs[0].reason, FinishReason::kAborted);
  EXPECT_TRUE(rt.idle());
}
