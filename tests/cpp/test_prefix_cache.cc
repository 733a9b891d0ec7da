// The prefix cache's index on its own (engine/prefix_cache.h) over a KvPool: lookups, reference
// counts, snapshots, eviction order, reset, bad input. The scheduler's use of it and a randomised
// stress test: test_prefix_cache_stress.cc; exactness on the model: test_prefix_cache_model.cc.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "runtime/engine/prefix_cache.h"
#include "runtime/model/kv_pool.h"

namespace dsv41rt::engine {
namespace {

using model::KvPool;
using model::PoolGeometry;

constexpr int64_t kPage = 4;

std::vector<int32_t> seq(int64_t n, int32_t base) {
  std::vector<int32_t> s(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) s[size_t(i)] = base + int32_t(i);
  return s;
}

void check(const KvPool& pool, const PrefixCache& cache,
           std::vector<const std::vector<int32_t>*> tables, std::vector<int32_t> slots) {
  std::vector<std::vector<int32_t>> cached;
  cache.owners(cached, slots);
  for (const auto& t : cached) tables.push_back(&t);
  pool.check_invariants(tables, slots);
}

TEST(PrefixCache, HitsEndAtASnapshotAndShareThePages) {
  KvPool pool(PoolGeometry{kPage, 0, 0}, 16, 4);
  PrefixCache cache(pool);
  const std::vector<int32_t> tokens = seq(13, 100);
  std::vector<int32_t> pages;
  ASSERT_TRUE(pool.ensure_pages(pages, 13));  // 4 pages
  const int32_t snap = pool.alloc_slot();
  EXPECT_TRUE(cache.insert(tokens, 12, pages, snap));  // 3 blocks, snapshot at 12
  EXPECT_EQ(pool.page_refs(pages[0]), 2);
  EXPECT_EQ(pool.page_refs(pages[3]), 1);  // the partial page is the request's alone
  check(pool, cache, {&pages}, {});
  EXPECT_EQ(cache.stats().pages, 3);
  EXPECT_EQ(cache.stats().snapshots, 1);

  // The whole prefix, a longer sequence, one whose limit stops short, one that differs early.
  PrefixHit hit = cache.lookup(tokens, 12);
  EXPECT_EQ(hit.tokens, 12);
  EXPECT_EQ(hit.snapshot_slot, snap);
  EXPECT_EQ(hit.pages, std::vector<int32_t>(pages.begin(), pages.begin() + 3));
  std::vector<int32_t> longer = seq(40, 100);
  EXPECT_EQ(cache.lookup(longer, 39).tokens, 12);
  EXPECT_EQ(cache.lookup(tokens, 11).tokens, 0);  // nodes at 4 and 8 have no snapshot
  std::vector<int32_t> differs = tokens;
  differs[5] = 7;
  EXPECT_EQ(cache.lookup(differs, 12).tokens, 0);
  EXPECT_TRUE(cache.has_snapshot(tokens, 12));
  EXPECT_FALSE(cache.has_snapshot(tokens, 8));
  EXPECT_FALSE(cache.has_snapshot(tokens, 0));

  // A second snapshot on the same boundary is refused (the caller keeps its slot).
  const int32_t other = pool.alloc_slot();
  EXPECT_FALSE(cache.insert(tokens, 12, pages, other));
  pool.free_slot(other);
  // A snapshot at 8 added later: shorter prompts now hit there.
  const int32_t snap8 = pool.alloc_slot();
  EXPECT_TRUE(cache.insert(tokens, 8, pages, snap8));
  EXPECT_EQ(cache.lookup(tokens, 11).tokens, 8);
  EXPECT_EQ(pool.page_refs(pages[0]), 2);  // no second reference for an indexed block

  pool.free_pages(pages);  // the request ends: the cache keeps three pages
  EXPECT_EQ(pool.usage().pages_used, 3);
  EXPECT_EQ(pool.usage().slots_used, 2);
  check(pool, cache, {}, {});
  cache.reset();
  EXPECT_EQ(pool.usage().pages_used, 0);
  EXPECT_EQ(pool.usage().slots_used, 0);
  check(pool, cache, {}, {});
  EXPECT_EQ(cache.lookup(tokens, 12).tokens, 0);
}

TEST(PrefixCache, AnotherCopyOfACachedBlockSwitchesToTheCachedPage) {
  KvPool pool(PoolGeometry{kPage, 0, 0}, 16, 4);
  PrefixCache cache(pool);
  const std::vector<int32_t> tokens = seq(9, 7);
  std::vector<int32_t> a, b;
  ASSERT_TRUE(pool.ensure_pages(a, 9));
  ASSERT_TRUE(pool.ensure_pages(b, 9));
  EXPECT_TRUE(cache.insert(tokens, 4, a, pool.alloc_slot()));
  const std::vector<int32_t> b_before = b;
  // b computed the same blocks itself; publishing up to 8 reuses a's cached block 0.
  EXPECT_TRUE(cache.insert(tokens, 8, b, pool.alloc_slot()));
  EXPECT_EQ(b[0], a[0]);
  EXPECT_EQ(b[1], b_before[1]);
  EXPECT_EQ(pool.page_refs(b_before[0]), 0);  // b's own copy went back to the pool
  EXPECT_EQ(pool.page_refs(a[0]), 3);
  check(pool, cache, {&a, &b}, {});
  pool.free_pages(a);
  pool.free_pages(b);
  cache.reset();
  EXPECT_EQ(pool.usage().pages_used, 0);
}

TEST(PrefixCache, EvictsLeastRecentlyUsedUnreferencedLeavesFirst) {
  KvPool pool(PoolGeometry{kPage, 0, 0}, 16, 6);
  PrefixCache cache(pool);
  const std::vector<int32_t> x = seq(8, 0), y = seq(8, 1000);
  std::vector<int32_t> px, py;
  ASSERT_TRUE(pool.ensure_pages(px, 8));
  ASSERT_TRUE(pool.ensure_pages(py, 8));
  cache.insert(x, 8, px, pool.alloc_slot());
  cache.insert(y, 8, py, pool.alloc_slot());
  pool.free_pages(px);
  std::vector<int32_t> held = py;  // a request still holds y's pages
  pool.free_pages(py);
  pool.retain_pages(held);
  EXPECT_EQ(cache.lookup(x, 8).tokens, 8);  // x is now the most recently used
  // Only x's pages are unreferenced: its leaf goes first, then its parent, then nothing.
  const int64_t used = pool.usage().pages_used;
  EXPECT_TRUE(cache.evict_page());
  EXPECT_EQ(pool.usage().pages_used, used - 1);
  EXPECT_EQ(cache.stats().snapshots, 1);  // x's snapshot went with its leaf
  EXPECT_EQ(cache.lookup(x, 8).tokens, 0);
  EXPECT_TRUE(cache.evict_page());
  EXPECT_FALSE(cache.evict_page());
  EXPECT_EQ(cache.lookup(y, 8).tokens, 8);
  check(pool, cache, {&held}, {});
  // Snapshots go on their own, even when their pages are held.
  EXPECT_TRUE(cache.evict_snapshot());
  EXPECT_FALSE(cache.evict_snapshot());
  EXPECT_EQ(cache.lookup(y, 8).tokens, 0);
  EXPECT_EQ(cache.stats().evicted_pages, 2);
  EXPECT_EQ(cache.stats().evicted_snapshots, 2);
  pool.free_pages(held);
  cache.reset();
  EXPECT_EQ(pool.usage().pages_used, 0);
  EXPECT_EQ(pool.usage().slots_used, 0);
}

TEST(PrefixCache, BadInputIsAnErrorAndChangesNothing) {
  KvPool pool(PoolGeometry{kPage, 0, 0}, 4, 2);
  PrefixCache cache(pool);
  const std::vector<int32_t> tokens = seq(8, 0);
  std::vector<int32_t> pages;
  ASSERT_TRUE(pool.ensure_pages(pages, 8));
  EXPECT_THROW(cache.insert(tokens, 6, pages, -1), Error);   // not a page boundary
  EXPECT_THROW(cache.insert(tokens, 0, pages, -1), Error);   // empty
  EXPECT_THROW(cache.insert(tokens, 12, pages, -1), Error);  // past the tokens
  std::vector<int32_t> short_table{pages[0]};
  EXPECT_THROW(cache.insert(tokens, 8, short_table, -1), Error);
  std::vector<int32_t> freed{3};  // the pool hands out the lowest ids first: 3 is free
  ASSERT_EQ(pool.page_refs(3), 0);
  EXPECT_THROW(cache.insert(tokens, 4, freed, -1), Error);
  EXPECT_THROW(cache.has_snapshot(tokens, 3), Error);
  EXPECT_EQ(cache.stats().pages, 0);
  check(pool, cache, {&pages}, {});
  EXPECT_THROW(pool.retain_pages({pages[0], pages[0]}), Error);
  EXPECT_THROW(pool.retain_pages({99}), Error);
  EXPECT_THROW(pool.page_refs(-1), Error);
  pool.free_pages(pages);
}

}  // namespace
}  // namespace dsv41rt::engine
