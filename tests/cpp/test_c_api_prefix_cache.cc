// Prefix caching through the C API: on by default, off on request, and a host built against the
// header before enable_prefix_caching (struct_size ending before it) still runs with the default.
// The same prompt twice gives the same tokens either way (the cache is exact). Resetting the cache
// between the runs makes the second run find nothing.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "dsv41rt/dsv41rt.h"

namespace {

const char* checkpoint() { return std::getenv("DSV41RT_TEST_CHECKPOINT"); }

// The tiny checkpoint with a small pool of 4-position pages (prefix hits in whole pages).
void small_pool(dsv41rt_runtime_params& p) {
  p.checkpoint_dir = checkpoint();
  p.max_num_seqs = 4;
  p.kv_memory = 64ll << 20;
  p.page_size = 4;
}

std::vector<int32_t> prompt23() {
  std::vector<int32_t> prompt(23);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t(3 + 7919 * i % 100000);
  return prompt;
}

// Submits `prompt` for 4 new tokens (EOS ignored) and waits until it finishes; its tokens.
std::vector<int32_t> generate(dsv41rt_runtime* rt, const std::vector<int32_t>& prompt) {
  dsv41rt_request_params rp;
  dsv41rt_request_default_params(&rp);
  rp.max_new_tokens = 4;
  rp.ignore_eos = 1;
  int64_t id = 0;
  EXPECT_EQ(dsv41rt_submit(rt, prompt.data(), prompt.size(), &rp, &id), DSV41RT_OK);
  std::vector<int32_t> tokens;
  for (int done = 0; !done;) {
    int32_t buf[8];
    size_t n = 0;
    EXPECT_EQ(dsv41rt_wait(rt, id, -1, buf, 8, &n, &done), DSV41RT_OK);
    tokens.insert(tokens.end(), buf, buf + n);
  }
  return tokens;
}

// Runs `prompt` to completion `times` times in turn (resetting the prefix cache between runs when
// `reset`); the tokens of each run. `counters`: the prefix cache's queries and hits at the end.
std::vector<std::vector<int32_t>> run(const dsv41rt_runtime_params& p,
                                      const std::vector<int32_t>& prompt, int times,
                                      std::pair<int64_t, int64_t>& counters, bool reset = false) {
  dsv41rt_runtime* rt = nullptr;
  EXPECT_EQ(dsv41rt_runtime_create(DSV41RT_ABI_VERSION, &p, &rt), DSV41RT_OK)
      << dsv41rt_last_error(nullptr);
  std::vector<std::vector<int32_t>> out;
  if (!rt) return out;
  for (int i = 0; i < times; ++i) {
    if (reset && i > 0) {
      EXPECT_EQ(dsv41rt_reset_prefix_cache(rt), DSV41RT_OK);
    }
    out.push_back(generate(rt, prompt));
  }
  dsv41rt_stats st;
  dsv41rt_stats_init(&st);
  EXPECT_EQ(dsv41rt_get_stats(rt, &st), DSV41RT_OK);
  EXPECT_EQ(st.pages_used, 0);  // pages only the cache holds are not in use
  counters = {st.prefix_cache_queries, st.prefix_cache_hits};
  // A host built against the 0.1.0 header: its shorter stats struct is filled up to its end.
  dsv41rt_stats old;
  dsv41rt_stats_init(&old);
  old.struct_size = offsetof(dsv41rt_stats, prefix_cache_queries);
  old.prefix_cache_queries = -7;
  EXPECT_EQ(dsv41rt_get_stats(rt, &old), DSV41RT_OK);
  EXPECT_EQ(old.steps, st.steps);
  EXPECT_EQ(old.prefix_cache_queries, -7);
  // One built against the header before the host tier's counters: filled up to its end too.
  dsv41rt_stats before_host;
  dsv41rt_stats_init(&before_host);
  before_host.struct_size = offsetof(dsv41rt_stats, prefix_cache_host_bytes);
  before_host.prefix_cache_host_bytes = -7;
  EXPECT_EQ(dsv41rt_get_stats(rt, &before_host), DSV41RT_OK);
  EXPECT_EQ(before_host.prefix_cache_hits, st.prefix_cache_hits);
  EXPECT_EQ(before_host.prefix_cache_host_bytes, -7);
  EXPECT_GE(st.prefix_cache_host_bytes, 0);
  EXPECT_EQ(dsv41rt_runtime_destroy(rt), DSV41RT_OK);
  return out;
}

TEST(CApiPrefixCache, OnByDefaultOffOnRequestAndTheOlderLayout) {
  dsv41rt_runtime_params p;
  dsv41rt_runtime_default_params(&p);
  EXPECT_EQ(p.enable_prefix_caching, 1);
  if (!checkpoint()) GTEST_SKIP() << "set DSV41RT_TEST_CHECKPOINT to a tiny-v41 checkpoint";
  small_pool(p);
  const std::vector<int32_t> prompt = prompt23();
  std::pair<int64_t, int64_t> counters_on, counters_off, counters_old;
  const auto on = run(p, prompt, 2, counters_on);
  dsv41rt_runtime_params off = p;
  off.enable_prefix_caching = 0;
  const auto without = run(off, prompt, 2, counters_off);
  dsv41rt_runtime_params older = off;  // 0 stays in the bytes an older host does not have
  older.struct_size = offsetof(dsv41rt_runtime_params, enable_prefix_caching);
  const auto old_layout = run(older, prompt, 2, counters_old);
  // Two runs of 23 tokens queried; the second found 20 cached (5 pages of 4 positions).
  EXPECT_EQ(counters_on, std::make_pair(int64_t(46), int64_t(20)));
  EXPECT_EQ(counters_off, std::make_pair(int64_t(0), int64_t(0)));  // nothing looked up
  EXPECT_EQ(counters_old, counters_on);
  ASSERT_EQ(on.size(), 2u);
  EXPECT_EQ(on[0].size(), 4u);
  EXPECT_EQ(on[0], on[1]);
  EXPECT_EQ(on, without);
  EXPECT_EQ(on, old_layout);
}

TEST(CApiPrefixCache, ResetForgetsTheCachedPrefixes) {
  EXPECT_EQ(dsv41rt_reset_prefix_cache(nullptr), DSV41RT_E_INVALID_HANDLE);
  if (!checkpoint()) GTEST_SKIP() << "set DSV41RT_TEST_CHECKPOINT to a tiny-v41 checkpoint";
  dsv41rt_runtime_params p;
  dsv41rt_runtime_default_params(&p);
  small_pool(p);
  const std::vector<int32_t> prompt = prompt23();
  std::pair<int64_t, int64_t> kept, reset, off_counters;
  const auto with_cache = run(p, prompt, 2, kept);
  const auto after_reset = run(p, prompt, 2, reset, /*reset=*/true);
  EXPECT_EQ(kept, std::make_pair(int64_t(46), int64_t(20)));
  EXPECT_EQ(reset, std::make_pair(int64_t(46), int64_t(0)));  // queried, nothing left to find
  EXPECT_EQ(after_reset, with_cache);
  dsv41rt_runtime_params off = p;
  off.enable_prefix_caching = 0;  // a reset is then a no-op, not an error
  EXPECT_EQ(run(off, prompt, 2, off_counters, /*reset=*/true), with_cache);
}

}  // namespace

namespace {

// Runs `prompts` one after the other to completion on a new runtime; the tokens of each. `st`:
// the stats at the end.
std::vector<std::vector<int32_t>> run_prompts(const dsv41rt_runtime_params& p,
                                              const std::vector<std::vector<int32_t>>& prompts,
                                              dsv41rt_stats& st) {
  dsv41rt_runtime* rt = nullptr;
  EXPECT_EQ(dsv41rt_runtime_create(DSV41RT_ABI_VERSION, &p, &rt), DSV41RT_OK)
      << dsv41rt_last_error(nullptr);
  std::vector<std::vector<int32_t>> out;
  if (!rt) return out;
  for (const std::vector<int32_t>& prompt : prompts) out.push_back(generate(rt, prompt));
  dsv41rt_stats_init(&st);
  EXPECT_EQ(dsv41rt_get_stats(rt, &st), DSV41RT_OK);
  EXPECT_EQ(dsv41rt_runtime_destroy(rt), DSV41RT_OK);
  return out;
}

// In a pool of about 40 pages, three long prompts push a prompt's state out; sent again, it comes
// back from the host tier (the counters say so) with the tokens of a run without the cache.
TEST(CApiPrefixCache, TheHostTierBringsAnEvictedPromptBack) {
  if (!checkpoint()) GTEST_SKIP() << "set DSV41RT_TEST_CHECKPOINT to a tiny-v41 checkpoint";
  dsv41rt_runtime_params p;
  dsv41rt_runtime_default_params(&p);
  p.checkpoint_dir = checkpoint();
  p.kv_memory = 2400ll << 10;
  p.max_num_seqs = 4;
  p.page_size = 4;
  p.max_num_batched_tokens = 24;
  p.max_model_len = 128;
  auto tokens = [](size_t n, int32_t salt) {
    std::vector<int32_t> t(n);
    for (size_t i = 0; i < n; ++i) t[i] = int32_t(3 + (7919 * i + 104729 * size_t(salt)) % 100000);
    return t;
  };
  const std::vector<std::vector<int32_t>> prompts = {tokens(37, 1), tokens(96, 2), tokens(96, 3),
                                                     tokens(96, 4), tokens(37, 1)};
  dsv41rt_stats off_stats, cache_stats, host_stats;
  dsv41rt_runtime_params off = p;
  off.enable_prefix_caching = 0;
  const auto reference = run_prompts(off, prompts, off_stats);
  const auto cache = run_prompts(p, prompts, cache_stats);
  dsv41rt_runtime_params host = p;
  host.host_cache_memory = 1 << 20;
  const auto with_host = run_prompts(host, prompts, host_stats);
  ASSERT_EQ(reference.size(), prompts.size());
  EXPECT_EQ(cache, reference);
  EXPECT_EQ(with_host, reference);
  EXPECT_LT(cache_stats.pages_total, 60);
  EXPECT_EQ(cache_stats.prefix_cache_host_restored_pages, 0);
  EXPECT_GT(host_stats.prefix_cache_host_offloaded_pages, 0);
  EXPECT_GT(host_stats.prefix_cache_host_restored_pages, 0);
  EXPECT_GT(host_stats.prefix_cache_host_bytes, 0);
  EXPECT_GT(host_stats.prefix_cache_hits, cache_stats.prefix_cache_hits);  // the re-sent prompt
}

// host_cache_memory: off by default; a host tier gives the same tokens; a negative size is an
// error naming the field; a host built against the header before the field runs with it off.
TEST(CApiPrefixCache, HostCacheMemoryOffByDefaultCheckedAndTheOlderLayout) {
  dsv41rt_runtime_params p;
  dsv41rt_runtime_default_params(&p);
  EXPECT_EQ(p.host_cache_memory, 0);
  if (!checkpoint()) GTEST_SKIP() << "set DSV41RT_TEST_CHECKPOINT to a tiny-v41 checkpoint";
  small_pool(p);
  const std::vector<int32_t> prompt = prompt23();
  std::pair<int64_t, int64_t> counters_on, counters_host, counters_old;
  const auto on = run(p, prompt, 2, counters_on);
  dsv41rt_runtime_params host = p;
  host.host_cache_memory = 8ll << 20;
  EXPECT_EQ(run(host, prompt, 2, counters_host), on);
  EXPECT_EQ(counters_host, counters_on);
  dsv41rt_runtime_params bad = p;
  bad.host_cache_memory = -1;
  dsv41rt_runtime* rt = nullptr;
  EXPECT_EQ(dsv41rt_runtime_create(DSV41RT_ABI_VERSION, &bad, &rt), DSV41RT_E_INVALID_ARGUMENT);
  EXPECT_NE(std::string(dsv41rt_last_error(nullptr)).find("host_cache_memory"), std::string::npos)
      << dsv41rt_last_error(nullptr);
  dsv41rt_runtime_params older = bad;  // -1 stays in the bytes an older host does not have
  older.struct_size = offsetof(dsv41rt_runtime_params, host_cache_memory);
  EXPECT_EQ(run(older, prompt, 2, counters_old), on);
  EXPECT_EQ(counters_old, counters_on);
}

}  // namespace
