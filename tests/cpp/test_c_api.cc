// The C API (cpp/include/dsv41rt/dsv41rt.h): documented status codes for misuse, never a crash.
// Tests that need a loaded model read a tiny checkpoint from DSV41RT_TEST_CHECKPOINT
// (scripts/test.sh generates it); without it they are skipped with a message.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "c_api_test_util.h"
#include "dsv41rt/dsv41rt.h"

namespace {

const char* checkpoint() { return std::getenv("DSV41RT_TEST_CHECKPOINT"); }

// max_num_seqs = 0: the default.
dsv41rt_runtime* make_runtime(int64_t max_num_seqs = 0) {
  dsv41rt_runtime_params p;
  dsv41rt_runtime_default_params(&p);
  p.checkpoint_dir = checkpoint();
  if (max_num_seqs > 0) p.max_num_seqs = max_num_seqs;
  dsv41rt_runtime* rt = nullptr;
  EXPECT_EQ(dsv41rt_runtime_create(DSV41RT_ABI_VERSION, &p, &rt), DSV41RT_OK)
      << dsv41rt_last_error(nullptr);
  return rt;
}

#define NEED_CHECKPOINT() \
  if (!checkpoint()) GTEST_SKIP() << "set DSV41RT_TEST_CHECKPOINT to a tiny-v41 checkpoint"

const std::vector<int32_t> kPrompt = {0, 671, 6102, 13462};

}  // namespace

TEST(CApi, VersionAndNames) {
  EXPECT_EQ(dsv41rt_abi_version(), uint32_t(DSV41RT_ABI_VERSION));
  EXPECT_STREQ(dsv41rt_version(), "0.1.0");
  EXPECT_STREQ(dsv41rt_status_name(DSV41RT_E_INVALID_HANDLE), "invalid_handle");
  EXPECT_STREQ(dsv41rt_status_name(static_cast<dsv41rt_status>(999)), "unknown_status");
}

TEST(CApi, NullHandlesAreInvalidHandle) {
  int32_t buf[4];
  size_t n = 0;
  int fin = 0;
  int64_t id = 0;
  dsv41rt_request_params rp;
  dsv41rt_request_default_params(&rp);
  dsv41rt_stats st;
  dsv41rt_stats_init(&st);
  EXPECT_EQ(dsv41rt_submit(nullptr, kPrompt.data(), kPrompt.size(), &rp, &id),
            DSV41RT_E_INVALID_HANDLE);
  EXPECT_EQ(dsv41rt_poll(nullptr, 1, buf, 4, &n, &fin), DSV41RT_E_INVALID_HANDLE);
  EXPECT_EQ(dsv41rt_wait(nullptr, 1, 0, buf, 4, &n, &fin), DSV41RT_E_INVALID_HANDLE);
  EXPECT_EQ(dsv41rt_cancel(nullptr, 1), DSV41RT_E_INVALID_HANDLE);
  EXPECT_EQ(dsv41rt_get_stats(nullptr, &st), DSV41RT_E_INVALID_HANDLE);
  EXPECT_STREQ(dsv41rt_last_error(nullptr), "runtime handle is NULL");
  EXPECT_EQ(dsv41rt_runtime_destroy(nullptr), DSV41RT_OK);
  // A pointer that was never a runtime.
  auto* fake = reinterpret_cast<dsv41rt_runtime*>(&buf[0]);
  EXPECT_EQ(dsv41rt_cancel(fake, 1), DSV41RT_E_INVALID_HANDLE);
  EXPECT_EQ(dsv41rt_runtime_destroy(fake), DSV41RT_E_INVALID_HANDLE);
  dsv41rt_runtime_default_params(nullptr);  // no crash
  dsv41rt_request_default_params(nullptr);
}

TEST(CApi, CreateRejectsBadArguments) {
  dsv41rt_runtime* rt = reinterpret_cast<dsv41rt_runtime*>(0x1);
  dsv41rt_runtime_params p;
  dsv41rt_runtime_default_params(&p);
  EXPECT_EQ(dsv41rt_runtime_create(DSV41RT_ABI_VERSION, &p, nullptr), DSV41RT_E_INVALID_ARGUMENT);
  EXPECT_EQ(dsv41rt_runtime_create(DSV41RT_ABI_VERSION + 1, &p, &rt), DSV41RT_E_ABI_MISMATCH);
  EXPECT_EQ(rt, nullptr);
  EXPECT_NE(std::string(dsv41rt_last_error(nullptr)).find("ABI version"), std::string::npos);
  EXPECT_EQ(dsv41rt_runtime_create(DSV41RT_ABI_VERSION, nullptr, &rt), DSV41RT_E_INVALID_ARGUMENT);
  dsv41rt_runtime_params wrong = p;
  for (const uint32_t size : {uint32_t(sizeof(p) + 8), uint32_t(sizeof(p) - 4), uint32_t(4)}) {
    wrong.struct_size = size;  // a newer host's struct, or no layout this library ever had
    EXPECT_EQ(dsv41rt_runtime_create(DSV41RT_ABI_VERSION, &wrong, &rt), DSV41RT_E_ABI_MISMATCH)
        << size;
    EXPECT_NE(std::string(dsv41rt_last_error(nullptr)).find("struct_size"), std::string::npos);
  }
  EXPECT_EQ(dsv41rt_runtime_create(DSV41RT_ABI_VERSION, &p, &rt),
            DSV41RT_E_INVALID_ARGUMENT);  // no dir
  p.checkpoint_dir = "/nonexistent/dsv41rt/checkpoint";
  EXPECT_NE(dsv41rt_runtime_create(DSV41RT_ABI_VERSION, &p, &rt), DSV41RT_OK);
  EXPECT_NE(std::string(dsv41rt_last_error(nullptr)).find("/nonexistent/dsv41rt/checkpoint"),
            std::string::npos);
  EXPECT_EQ(rt, nullptr);
  p.checkpoint_dir = "x";
  p.max_num_seqs = 0;
  EXPECT_EQ(dsv41rt_runtime_create(DSV41RT_ABI_VERSION, &p, &rt), DSV41RT_E_INVALID_ARGUMENT);
}

// max_prefill_tokens_while_decoding came after 0.1.0: a negative value is refused by name, and a
// host built against the 0.1.0 header (struct_size ending before the field) still runs, with the
// field at its default whatever lies in memory after its struct.
TEST(CApi, PrefillCapAndThe010ParamsLayout) {
  dsv41rt_runtime_params p;
  dsv41rt_runtime_default_params(&p);
  EXPECT_EQ(p.max_prefill_tokens_while_decoding, 0);
  dsv41rt_runtime* rt = nullptr;
  p.checkpoint_dir = "x";
  p.max_prefill_tokens_while_decoding = -1;
  EXPECT_EQ(dsv41rt_runtime_create(DSV41RT_ABI_VERSION, &p, &rt), DSV41RT_E_INVALID_ARGUMENT);
  EXPECT_NE(std::string(dsv41rt_last_error(nullptr)).find("max_prefill_tokens_while_decoding"),
            std::string::npos)
      << dsv41rt_last_error(nullptr);
  EXPECT_EQ(rt, nullptr);
  NEED_CHECKPOINT();
  p.checkpoint_dir = checkpoint();
  dsv41rt_runtime_params old = p;  // -1 stays in the bytes a 0.1.0 host does not have
  old.struct_size = offsetof(dsv41rt_runtime_params, max_prefill_tokens_while_decoding);
  ASSERT_EQ(dsv41rt_runtime_create(DSV41RT_ABI_VERSION, &old, &rt), DSV41RT_OK)
      << dsv41rt_last_error(nullptr);
  EXPECT_EQ(dsv41rt_runtime_destroy(rt), DSV41RT_OK);
  rt = nullptr;
  p.max_prefill_tokens_while_decoding = 8;  // a cap: requests still complete
  ASSERT_EQ(dsv41rt_runtime_create(DSV41RT_ABI_VERSION, &p, &rt), DSV41RT_OK)
      << dsv41rt_last_error(nullptr);
  dsv41rt_request_params rp;
  dsv41rt_request_default_params(&rp);
  rp.max_new_tokens = 3;
  int64_t a = 0, b = 0;
  ASSERT_EQ(dsv41rt_submit(rt, kPrompt.data(), kPrompt.size(), &rp, &a), DSV41RT_OK);
  ASSERT_EQ(dsv41rt_submit(rt, kPrompt.data(), kPrompt.size(), &rp, &b), DSV41RT_OK);
  for (const int64_t id : {a, b}) {
    int32_t buf[8];
    size_t n = 0, total = 0;
    int fin = 0;
    while (!fin) {
      ASSERT_EQ(dsv41rt_wait(rt, id, 60000, buf, 8, &n, &fin), DSV41RT_OK)
          << dsv41rt_last_error(rt);
      total += n;
    }
    EXPECT_EQ(total, 3u) << "request " << id;
  }
  EXPECT_EQ(dsv41rt_runtime_destroy(rt), DSV41RT_OK);
}

// max_decode_slowdown (after speculative_config): 0 by default, below 1 or not finite refused by
// name, a host built before it (struct_size ending at the field) gets it off; on, one request's
// greedy tokens are unchanged (the cap only applies beside decodes).
TEST(CApi, DecodeSlowdownAndTheLayoutBeforeIt) {
  dsv41rt_runtime_params p;
  dsv41rt_runtime_default_params(&p);
  EXPECT_EQ(p.max_decode_slowdown, 0.0);
  p.checkpoint_dir = "x";
  for (double bad : {0.5, -1.0, std::numeric_limits<double>::quiet_NaN()}) {
    dsv41rt_runtime* rt = nullptr;
    p.max_decode_slowdown = bad;
    EXPECT_EQ(dsv41rt_runtime_create(DSV41RT_ABI_VERSION, &p, &rt), DSV41RT_E_INVALID_ARGUMENT)
        << bad;
    EXPECT_NE(std::string(dsv41rt_last_error(nullptr)).find("max_decode_slowdown"),
              std::string::npos)
        << dsv41rt_last_error(nullptr);
    EXPECT_EQ(rt, nullptr);
  }
  NEED_CHECKPOINT();
  p.checkpoint_dir = checkpoint();
  p.max_decode_slowdown = 0;
  const std::vector<int32_t> want = dsv41rt::testing::c_api_generate(p, kPrompt, 4);
  EXPECT_EQ(want.size(), 4u);
  dsv41rt_runtime_params old = p;  // 0.5 sits in bytes an older host does not have
  old.max_decode_slowdown = 0.5;
  old.struct_size = offsetof(dsv41rt_runtime_params, max_decode_slowdown);
  EXPECT_EQ(dsv41rt::testing::c_api_generate(old, kPrompt, 4), want);
  p.max_decode_slowdown = 2.0;
  EXPECT_EQ(dsv41rt::testing::c_api_generate(p, kPrompt, 4), want);
}

// Tensor x expert parallelism through the C API: the same greedy tokens as one rank; a size that
// cannot split the model is an invalid-argument error naming it; a host built before the fields
// (struct_size ending at host_cache_memory) gets one rank.
TEST(CApi, ParallelSizesGiveTheOneRankTokens) {
  NEED_CHECKPOINT();
  auto tokens = [](const dsv41rt_runtime_params& p) {
    return dsv41rt::testing::c_api_generate(p, kPrompt, 6);
  };
  dsv41rt_runtime_params p;
  dsv41rt_runtime_default_params(&p);
  EXPECT_EQ(p.tensor_parallel_size, 1);
  EXPECT_EQ(p.expert_parallel_size, 1);
  p.checkpoint_dir = checkpoint();
  const std::vector<int32_t> want = tokens(p);
  EXPECT_EQ(want.size(), 6u);
  dsv41rt_runtime_params par = p;
  par.tensor_parallel_size = 2, par.expert_parallel_size = 2;
  EXPECT_EQ(tokens(par), want);
  dsv41rt_runtime_params old = par;  // the 2s sit in bytes an older host does not have
  old.struct_size = offsetof(dsv41rt_runtime_params, tensor_parallel_size);
  EXPECT_EQ(tokens(old), want);
  dsv41rt_runtime_params bad = p;
  bad.expert_parallel_size = 3;
  dsv41rt_runtime* rt = nullptr;
  EXPECT_EQ(dsv41rt_runtime_create(DSV41RT_ABI_VERSION, &bad, &rt), DSV41RT_E_INVALID_ARGUMENT);
  EXPECT_NE(std::string(dsv41rt_last_error(nullptr)).find("expert_parallel_size 3"),
            std::string::npos)
      << dsv41rt_last_error(nullptr);
  EXPECT_EQ(rt, nullptr);
}

TEST(CApi, UnknownDeviceIsAClearError) {
  NEED_CHECKPOINT();
  dsv41rt_runtime_params p;
  dsv41rt_runtime_default_params(&p);
  p.checkpoint_dir = checkpoint();
  p.device = "tpu";
  dsv41rt_runtime* rt = nullptr;
  EXPECT_EQ(dsv41rt_runtime_create(DSV41RT_ABI_VERSION, &p, &rt), DSV41RT_E_INVALID_ARGUMENT);
  EXPECT_NE(std::string(dsv41rt_last_error(nullptr)).find("unknown device 'tpu'"),
            std::string::npos);
}

TEST(CApi, MisuseOfALiveRuntime) {
  NEED_CHECKPOINT();
  dsv41rt_runtime* rt = make_runtime();
  ASSERT_NE(rt, nullptr);
  dsv41rt_request_params rp;
  dsv41rt_request_default_params(&rp);
  int64_t id = -1;
  int32_t buf[64];
  size_t n = 0;
  int fin = 0;
  // Invalid params.
  EXPECT_EQ(dsv41rt_submit(rt, nullptr, 3, &rp, &id), DSV41RT_E_INVALID_ARGUMENT);
  EXPECT_EQ(dsv41rt_submit(rt, kPrompt.data(), 0, &rp, &id), DSV41RT_E_INVALID_ARGUMENT);
  EXPECT_EQ(dsv41rt_submit(rt, kPrompt.data(), kPrompt.size(), nullptr, &id),
            DSV41RT_E_INVALID_ARGUMENT);
  dsv41rt_request_params bad = rp;
  bad.struct_size = 4;
  EXPECT_EQ(dsv41rt_submit(rt, kPrompt.data(), kPrompt.size(), &bad, &id), DSV41RT_E_ABI_MISMATCH);
  bad = rp;
  bad.sampling.top_p = 0.0f;
  EXPECT_EQ(dsv41rt_submit(rt, kPrompt.data(), kPrompt.size(), &bad, &id),
            DSV41RT_E_INVALID_ARGUMENT);
  EXPECT_NE(std::string(dsv41rt_last_error(rt)).find("top_p"), std::string::npos);
  bad = rp;
  bad.max_new_tokens = 0;
  EXPECT_EQ(dsv41rt_submit(rt, kPrompt.data(), kPrompt.size(), &bad, &id),
            DSV41RT_E_INVALID_ARGUMENT);
  const std::vector<int32_t> out_of_vocab = {0, 1 << 30};
  EXPECT_EQ(dsv41rt_submit(rt, out_of_vocab.data(), 2, &rp, &id), DSV41RT_E_INVALID_ARGUMENT);
  bad = rp;
  bad.n_stop_token_ids = 2;  // stop_token_ids NULL
  EXPECT_EQ(dsv41rt_submit(rt, kPrompt.data(), kPrompt.size(), &bad, &id),
            DSV41RT_E_INVALID_ARGUMENT);
  bad = rp;
  bad.max_new_tokens = 1 << 30;  // more than the pool can ever hold
  EXPECT_EQ(dsv41rt_submit(rt, kPrompt.data(), kPrompt.size(), &bad, &id), DSV41RT_E_OUT_OF_RANGE);
  // Unknown ids.
  EXPECT_EQ(dsv41rt_cancel(rt, 12345), DSV41RT_E_NOT_FOUND);
  EXPECT_EQ(dsv41rt_poll(rt, 12345, buf, 64, &n, &fin), DSV41RT_E_NOT_FOUND);
  EXPECT_EQ(dsv41rt_poll(rt, 1, buf, 64, nullptr, &fin), DSV41RT_E_INVALID_ARGUMENT);
  dsv41rt_stats st;
  dsv41rt_stats_init(&st);
  st.struct_size = 3;
  EXPECT_EQ(dsv41rt_get_stats(rt, &st), DSV41RT_E_ABI_MISMATCH);
  // A good request still works after all that; wait times out on nothing and finishes.
  ASSERT_EQ(dsv41rt_submit(rt, kPrompt.data(), kPrompt.size(), &rp, &id), DSV41RT_OK)
      << dsv41rt_last_error(rt);
  std::vector<int32_t> got;
  for (int guard = 0; guard < 1000 && !fin; ++guard) {
    const dsv41rt_status s =
        dsv41rt_wait(rt, id, 5000, buf, 3, &n, &fin);  // small buffer: several calls
    ASSERT_EQ(s, DSV41RT_OK) << dsv41rt_last_error(rt);
    got.insert(got.end(), buf, buf + n);
  }
  EXPECT_EQ(fin, 1);
  EXPECT_EQ(got.size(), 16u);  // default max_new_tokens (tiny random weights rarely emit EOS first)
  EXPECT_EQ(dsv41rt_poll(rt, id, buf, 64, &n, &fin),
            DSV41RT_E_NOT_FOUND);  // forgotten once drained
  EXPECT_EQ(dsv41rt_cancel(rt, id), DSV41RT_E_NOT_FOUND);
  dsv41rt_stats_init(&st);
  ASSERT_EQ(dsv41rt_get_stats(rt, &st), DSV41RT_OK);
  EXPECT_EQ(st.requests_finished, 1);
  EXPECT_EQ(st.pages_used, 0);
  // Double destroy and use after destroy.
  EXPECT_EQ(dsv41rt_runtime_destroy(rt), DSV41RT_OK);
  EXPECT_EQ(dsv41rt_runtime_destroy(rt), DSV41RT_E_INVALID_HANDLE);
  EXPECT_EQ(dsv41rt_submit(rt, kPrompt.data(), kPrompt.size(), &rp, &id), DSV41RT_E_INVALID_HANDLE);
  EXPECT_EQ(dsv41rt_get_stats(rt, &st), DSV41RT_E_INVALID_HANDLE);
}

TEST(CApi, CancelFreesPagesAndEndsTheStream) {
  NEED_CHECKPOINT();
  dsv41rt_runtime* rt = make_runtime();
  ASSERT_NE(rt, nullptr);
  dsv41rt_request_params rp;
  dsv41rt_request_default_params(&rp);
  rp.max_new_tokens = 2000;
  rp.ignore_eos = 1;
  std::atomic<int> finished_calls{0};
  rp.callback = [](int64_t, const int32_t*, size_t, int finished, void* ud) {
    if (finished) static_cast<std::atomic<int>*>(ud)->fetch_add(1);
  };
  rp.user_data = &finished_calls;
  int64_t id = 0;
  ASSERT_EQ(dsv41rt_submit(rt, kPrompt.data(), kPrompt.size(), &rp, &id), DSV41RT_OK);
  int32_t buf[4];
  size_t n = 0;
  int fin = 0;
  EXPECT_EQ(dsv41rt_poll(rt, id, buf, 4, &n, &fin),
            DSV41RT_E_INVALID_ARGUMENT);  // callback request
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(dsv41rt_cancel(rt, id), DSV41RT_OK);
  EXPECT_EQ(finished_calls.load(), 1);
  dsv41rt_stats st;
  dsv41rt_stats_init(&st);
  ASSERT_EQ(dsv41rt_get_stats(rt, &st), DSV41RT_OK);
  EXPECT_EQ(st.pages_used, 0);
  EXPECT_EQ(st.requests_running + st.requests_waiting, 0);
  // Destroy with requests in flight cancels them.
  rp.callback = nullptr;
  for (int i = 0; i < 4; ++i)
    ASSERT_EQ(dsv41rt_submit(rt, kPrompt.data(), kPrompt.size(), &rp, &id), DSV41RT_OK);
  EXPECT_EQ(dsv41rt_runtime_destroy(rt), DSV41RT_OK);
}

TEST(CApi, ConcurrentSubmitsFromManyThreads) {
  NEED_CHECKPOINT();
  dsv41rt_runtime* rt = make_runtime();
  ASSERT_NE(rt, nullptr);
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      dsv41rt_request_params rp;
      dsv41rt_request_default_params(&rp);
      rp.max_new_tokens = 4;
      rp.ignore_eos = 1;
      rp.sampling.seed = uint64_t(t);
      int64_t id = 0;
      if (dsv41rt_submit(rt, kPrompt.data(), kPrompt.size(), &rp, &id) != DSV41RT_OK) return;
      int32_t buf[8];
      size_t n = 0, total = 0;
      int fin = 0;
      while (!fin && dsv41rt_wait(rt, id, 10000, buf, 8, &n, &fin) == DSV41RT_OK) total += n;
      if (fin && total == 4) ok.fetch_add(1);
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(ok.load(), 4);
  EXPECT_EQ(dsv41rt_runtime_destroy(rt), DSV41RT_OK);
}

TEST(CApi, WaitTimesOutWhileTheRequestIsQueued) {
  NEED_CHECKPOINT();
  dsv41rt_runtime* rt = make_runtime(/*max_num_seqs=*/1);  // B waits in the queue while A runs
  ASSERT_NE(rt, nullptr);
  dsv41rt_request_params rp;
  dsv41rt_request_default_params(&rp);
  rp.max_new_tokens = 1000;  // A runs until cancelled (about a second on the tiny model)
  rp.ignore_eos = 1;
  int64_t a = 0, b = 0;
  ASSERT_EQ(dsv41rt_submit(rt, kPrompt.data(), kPrompt.size(), &rp, &a), DSV41RT_OK);
  int32_t buf[16];
  size_t n = 0;
  int fin = 0;
  ASSERT_EQ(dsv41rt_wait(rt, a, 10000, buf, 16, &n, &fin), DSV41RT_OK);  // A is running
  ASSERT_EQ(fin, 0);
  rp.max_new_tokens = 3;
  ASSERT_EQ(dsv41rt_submit(rt, kPrompt.data(), kPrompt.size(), &rp, &b), DSV41RT_OK);
  EXPECT_EQ(dsv41rt_wait(rt, b, 20, buf, 16, &n, &fin), DSV41RT_E_TIMEOUT);
  EXPECT_NE(std::string(dsv41rt_last_error(rt)).find("nothing new for request"), std::string::npos)
      << dsv41rt_last_error(rt);
  EXPECT_EQ(dsv41rt_poll(rt, b, buf, 16, &n, &fin), DSV41RT_OK);  // a poll is not a timeout
  EXPECT_EQ(n, 0u);
  ASSERT_EQ(dsv41rt_cancel(rt, a), DSV41RT_OK);
  size_t total = 0;
  fin = 0;
  while (!fin && dsv41rt_wait(rt, b, 10000, buf, 16, &n, &fin) == DSV41RT_OK) total += n;
  EXPECT_EQ(fin, 1);
  EXPECT_EQ(total, 3u);  // B then ran to its length
  EXPECT_EQ(dsv41rt_runtime_destroy(rt), DSV41RT_OK);
}

TEST(CApi, DestroyWhileAnotherThreadWaitsEndsTheWait) {
  NEED_CHECKPOINT();
  // B stays queued behind A: its waiter is inside dsv41rt_wait throughout.
  dsv41rt_runtime* rt = make_runtime(/*max_num_seqs=*/1);
  ASSERT_NE(rt, nullptr);
  dsv41rt_request_params rp;
  dsv41rt_request_default_params(&rp);
  rp.max_new_tokens = 1000;
  rp.ignore_eos = 1;
  int64_t a = 0, b = 0;
  ASSERT_EQ(dsv41rt_submit(rt, kPrompt.data(), kPrompt.size(), &rp, &a), DSV41RT_OK);
  int32_t first[4];
  size_t n_first = 0;
  int fin_first = 0;
  ASSERT_EQ(dsv41rt_wait(rt, a, 10000, first, 4, &n_first, &fin_first), DSV41RT_OK);
  ASSERT_EQ(dsv41rt_submit(rt, kPrompt.data(), kPrompt.size(), &rp, &b), DSV41RT_OK);
  std::atomic<int> status{-1}, finished{-1};
  std::atomic<size_t> tokens{1};
  std::thread waiter([&] {
    int32_t buf[64];
    size_t n = 0;
    int fin = 0;
    status = dsv41rt_wait(rt, b, -1, buf, 64, &n, &fin);  // blocks: B never runs
    tokens = n;
    finished = fin;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(dsv41rt_runtime_destroy(rt), DSV41RT_OK);  // returns only once the waiter has left
  waiter.join();
  EXPECT_EQ(status.load(), DSV41RT_OK);
  EXPECT_EQ(finished.load(), 1);  // B ended (aborted by the shutdown) without a token
  EXPECT_EQ(tokens.load(), 0u);
}

TEST(CApi, EngineFailureIsEngineFailedForWaitersAndNewWork) {
  NEED_CHECKPOINT();
  setenv("DSV41RT_FAILPOINT_ENGINE_STEP", "3", 1);  // the third engine step throws
  dsv41rt_runtime* rt = make_runtime();
  unsetenv("DSV41RT_FAILPOINT_ENGINE_STEP");
  ASSERT_NE(rt, nullptr);
  dsv41rt_request_params rp;
  dsv41rt_request_default_params(&rp);
  rp.max_new_tokens = 50;
  rp.ignore_eos = 1;
  int64_t id = 0;
  ASSERT_EQ(dsv41rt_submit(rt, kPrompt.data(), kPrompt.size(), &rp, &id), DSV41RT_OK);
  int32_t buf[64];
  size_t n = 0, total = 0;
  int fin = 0;
  dsv41rt_status s = DSV41RT_OK;
  while (!fin && (s = dsv41rt_wait(rt, id, 10000, buf, 64, &n, &fin)) == DSV41RT_OK) total += n;
  EXPECT_EQ(s, DSV41RT_E_ENGINE_FAILED);
  EXPECT_EQ(fin, 1);
  EXPECT_EQ(total, 2u);  // the tokens of the two steps that ran came first
  const std::string msg = dsv41rt_last_error(rt);
  EXPECT_NE(msg.find("engine failed"), std::string::npos) << msg;
  EXPECT_NE(msg.find("DSV41RT_FAILPOINT_ENGINE_STEP"), std::string::npos) << msg;
  EXPECT_EQ(dsv41rt_submit(rt, kPrompt.data(), kPrompt.size(), &rp, &id), DSV41RT_E_ENGINE_FAILED);
  EXPECT_EQ(dsv41rt_runtime_destroy(rt), DSV41RT_OK);
}

TEST(CApi, UnreadableShardIsAnIoError) {
  NEED_CHECKPOINT();
  namespace fs = std::filesystem;
  char tmpl[] = "/tmp/dsv41rt-capi-io-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const fs::path dir(tmpl);
  fs::copy_file(fs::path(checkpoint()) / "config.json", dir / "config.json");
  // A shard that exists and opens but cannot be read: a sysfs attribute is a "regular" 4 KiB
  // file that mmap() refuses (ENODEV), as a failing disk or network mount would refuse a read.
  const fs::path unreadable = "/sys/devices/system/cpu/online";
  ASSERT_TRUE(fs::exists(unreadable)) << "this test needs sysfs";
  std::ofstream(dir / "model.safetensors.index.json")
      << R"({"metadata": {}, "weight_map": {"embed.weight": "shard.safetensors"}})";
  fs::create_symlink(unreadable, dir / "shard.safetensors");
  dsv41rt_runtime_params p;
  dsv41rt_runtime_default_params(&p);
  const std::string dir_s = dir.string();
  p.checkpoint_dir = dir_s.c_str();
  dsv41rt_runtime* rt = nullptr;
  EXPECT_EQ(dsv41rt_runtime_create(DSV41RT_ABI_VERSION, &p, &rt), DSV41RT_E_IO);
  EXPECT_EQ(rt, nullptr);
  const std::string msg = dsv41rt_last_error(nullptr);
  EXPECT_NE(msg.find("shard.safetensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("mmap failed"), std::string::npos) << msg;
  fs::remove_all(dir);
}
