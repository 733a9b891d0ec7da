// The prefix cache with its host tier (prefix_cache.h, host_tier.h) over a KvPool in host memory
// with real bytes: evicted pages and snapshots go to the host and come back bitwise, where a hit
// stops, what the budget drops, reset; pool and tree invariants after every operation. The store
// alone: test_host_tier.cc; the scheduler and the model with the tier: test_prefix_cache_stress.cc,
// test_prefix_cache_model_stress.cc.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "runtime/engine/prefix_cache.h"
#include "runtime/model/host_state_copy.h"
#include "runtime/model/kv_pool.h"

namespace dsv41rt::engine {
namespace {

using model::KvPool;
using model::PoolGeometry;
using model::PoolHostCopy;

constexpr int64_t kPage = 4, kPageBytes = 16, kSlotBytes = 8;

std::vector<int32_t> seq(int64_t n, int32_t base) {
  std::vector<int32_t> s(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) s[size_t(i)] = base + int32_t(i);
  return s;
}

void check(const KvPool& pool, const PrefixCache& cache,
           std::vector<const std::vector<int32_t>*> tables = {}) {
  std::vector<std::vector<int32_t>> cached;
  std::vector<int32_t> slots;
  cache.owners(cached, slots);
  for (const auto& t : cached) tables.push_back(&t);
  pool.check_invariants(tables, slots);
}

std::vector<uint8_t> bytes_of(const uint8_t* p, int64_t n) { return {p, p + n}; }

void fill(uint8_t* p, int64_t n, int seed) {
  for (int64_t i = 0; i < n; ++i) p[i] = uint8_t(seed * 37 + i * 11 + 1);
}

struct Published {
  std::vector<int32_t> tokens = seq(13, 100);
  std::vector<std::vector<uint8_t>> page_bytes;  // blocks 0..2
  std::vector<uint8_t> snap8, snap12;
};

Published publish(KvPool& pool, PrefixCache& cache) {
  Published p;
  std::vector<int32_t> pages;
  EXPECT_TRUE(pool.ensure_pages(pages, 13));
  for (size_t k = 0; k < pages.size(); ++k) fill(pool.page_data(pages[k]), kPageBytes, int(k));
  for (size_t k = 0; k < 3; ++k) {
    p.page_bytes.push_back(bytes_of(pool.page_data(pages[k]), kPageBytes));
  }
  const int32_t s8 = pool.alloc_slot(), s12 = pool.alloc_slot();
  fill(pool.slot_data(s8), kSlotBytes, 8);
  fill(pool.slot_data(s12), kSlotBytes, 12);
  p.snap8 = bytes_of(pool.slot_data(s8), kSlotBytes);
  p.snap12 = bytes_of(pool.slot_data(s12), kSlotBytes);
  EXPECT_TRUE(cache.insert(p.tokens, 8, pages, s8));
  EXPECT_TRUE(cache.insert(p.tokens, 12, pages, s12));
  pool.free_pages(pages);
  check(pool, cache);
  return p;
}

void scribble(KvPool& pool) {  // so restored bytes can only have come from the host
  for (int32_t p = 0; p < pool.page_count(); ++p) fill(pool.page_data(p), kPageBytes, 99);
  for (int32_t s = 0; s < pool.slot_count(); ++s) fill(pool.slot_data(s), kSlotBytes, 98);
}

// A pool of `pages` pages (4 snapshot slots) with real bytes, a prefix cache over it whose host
// tier may hold 1 MiB, and the prefix `publish` puts in it.
struct PublishedOnPool {
  explicit PublishedOnPool(int64_t pages)
      : pool(PoolGeometry{kPage, kPageBytes, kSlotBytes}, pages, 4),
        copy(pool),
        cache(pool, 1 << 20, &copy),
        p(publish(pool, cache)) {}
  KvPool pool;
  PoolHostCopy copy;
  PrefixCache cache;
  const Published p;
};

void expect_no_pages_or_slots_used(const KvPool& pool) {
  EXPECT_EQ(pool.usage().pages_used, 0);
  EXPECT_EQ(pool.usage().slots_used, 0);
}

TEST(PrefixCacheHostTier, EvictedPagesComeBackFromTheHostBitwise) {
  PublishedOnPool setup(8);
  auto& [pool, copy, cache, p] = setup;
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(cache.evict_page());
    check(pool, cache);
  }
  EXPECT_FALSE(cache.evict_page());  // every node is on host: nothing left in the pool
  PrefixCacheStats s = cache.stats();
  EXPECT_EQ(s.pages, 0);
  EXPECT_EQ(s.snapshots, 0);
  EXPECT_EQ(s.host_pages, 3);
  EXPECT_EQ(s.host_snapshots, 2);
  EXPECT_EQ(s.offloaded_pages, 3);
  EXPECT_EQ(s.host_bytes, 3 * kPageBytes + 2 * kSlotBytes);
  expect_no_pages_or_slots_used(pool);
  scribble(pool);

  const PrefixHit hit = cache.lookup(p.tokens, 12);
  check(pool, cache);
  ASSERT_EQ(hit.tokens, 12);
  ASSERT_EQ(hit.pages.size(), 3u);
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_EQ(bytes_of(pool.page_data(hit.pages[k]), kPageBytes), p.page_bytes[k]) << k;
  }
  EXPECT_EQ(bytes_of(pool.slot_data(hit.snapshot_slot), kSlotBytes), p.snap12);
  s = cache.stats();
  EXPECT_EQ(s.restored_pages, 3);
  EXPECT_EQ(s.host_pages, 0);
  EXPECT_EQ(s.host_bytes, 0);
  EXPECT_EQ(s.snapshots, 2);  // the snapshot at 8 came back too: a slot was free
  EXPECT_EQ(cache.lookup(p.tokens, 11).tokens, 8);
  cache.reset();
  check(pool, cache);
  expect_no_pages_or_slots_used(pool);
}

TEST(PrefixCacheHostTier, AHitStopsWhereThePoolHasNoMorePages) {
  PublishedOnPool setup(4);
  auto& [pool, copy, cache, p] = setup;
  while (cache.evict_page()) check(pool, cache);
  std::vector<int32_t> held;  // another request holds two of the four pages
  ASSERT_TRUE(pool.ensure_pages(held, 2 * kPage));
  scribble(pool);
  const PrefixHit hit = cache.lookup(p.tokens, 12);
  check(pool, cache, {&held});
  // Blocks 0 and 1 came back (with the snapshot at 8); block 2 found no page and stays on host.
  EXPECT_EQ(hit.tokens, 8);
  ASSERT_EQ(hit.pages.size(), 2u);
  EXPECT_EQ(bytes_of(pool.slot_data(hit.snapshot_slot), kSlotBytes), p.snap8);
  EXPECT_EQ(bytes_of(pool.page_data(hit.pages[1]), kPageBytes), p.page_bytes[1]);
  EXPECT_EQ(cache.stats().host_pages, 1);
  // Once the pages are free, the rest comes back.
  pool.free_pages(held);
  const PrefixHit full = cache.lookup(p.tokens, 12);
  check(pool, cache);
  EXPECT_EQ(full.tokens, 12);
  EXPECT_EQ(bytes_of(pool.page_data(full.pages[2]), kPageBytes), p.page_bytes[2]);
  EXPECT_EQ(bytes_of(pool.slot_data(full.snapshot_slot), kSlotBytes), p.snap12);
  cache.reset();
  EXPECT_EQ(pool.usage().pages_used, 0);
}

TEST(PrefixCacheHostTier, RestoringEvictsOtherPagesNeverThePathsOwn) {
  PublishedOnPool setup(4);
  auto& [pool, copy, cache, p] = setup;
  while (cache.evict_page()) check(pool, cache);
  // Another prefix takes three of the four pages and ends; bringing p back must push its two
  // deeper blocks out to the host (its first block is an ancestor of theirs: it goes last).
  const std::vector<int32_t> other = seq(12, 5000);
  std::vector<int32_t> pages;
  ASSERT_TRUE(pool.ensure_pages(pages, 12));
  cache.insert(other, 12, pages, pool.alloc_slot());
  pool.free_pages(pages);
  check(pool, cache);
  const PrefixHit hit = cache.lookup(p.tokens, 12);
  check(pool, cache);
  EXPECT_EQ(hit.tokens, 12);
  EXPECT_EQ(bytes_of(pool.page_data(hit.pages[2]), kPageBytes), p.page_bytes[2]);
  EXPECT_EQ(cache.stats().host_pages, 2);         // other's two deeper blocks
  EXPECT_EQ(cache.lookup(other, 12).tokens, 12);  // and back again, p's two deeper blocks out
  check(pool, cache);
  EXPECT_EQ(cache.stats().host_pages, 2);
  EXPECT_EQ(cache.stats().restored_pages, 5);
  EXPECT_EQ(cache.lookup(p.tokens, 12).tokens, 12);
  check(pool, cache);
}

TEST(PrefixCacheHostTier, TheBudgetDropsLeastRecentlyUsedSubtreesAndOversizeEntries) {
  KvPool pool(PoolGeometry{kPage, kPageBytes, kSlotBytes}, 8, 4);
  PoolHostCopy copy(pool);
  // Room for one page entry and one page + snapshot entry.
  PrefixCache cache(pool, kPageBytes + (kPageBytes + kSlotBytes), &copy);
  auto publish8 = [&](int32_t base) {
    const std::vector<int32_t> t = seq(9, base);
    std::vector<int32_t> pages;
    EXPECT_TRUE(pool.ensure_pages(pages, 9));
    cache.insert(t, 8, pages, pool.alloc_slot());
    pool.free_pages(pages);
    return t;
  };
  const std::vector<int32_t> x = publish8(0);
  EXPECT_TRUE(cache.evict_page());  // x's leaf with its snapshot
  EXPECT_TRUE(cache.evict_page());  // x's root block
  check(pool, cache);
  EXPECT_EQ(cache.stats().host_pages, 2);
  const std::vector<int32_t> y = publish8(1000);
  EXPECT_TRUE(cache.evict_page());  // y's leaf: x's leaf entry goes to make room
  check(pool, cache);
  EXPECT_TRUE(cache.evict_page());  // y's root: x's root entry goes
  check(pool, cache);
  EXPECT_EQ(cache.stats().host_pages, 2);
  EXPECT_EQ(cache.lookup(x, 8).tokens, 0);
  EXPECT_EQ(cache.lookup(y, 8).tokens, 8);
  check(pool, cache);
  cache.reset();

  // A snapshot entry larger than the whole budget is dropped with its node; a page entry fits.
  PrefixCache small(pool, kPageBytes + kSlotBytes - 1, &copy);
  const std::vector<int32_t> z = seq(9, 2000);
  std::vector<int32_t> pages;
  ASSERT_TRUE(pool.ensure_pages(pages, 9));
  small.insert(z, 8, pages, pool.alloc_slot());
  pool.free_pages(pages);
  EXPECT_TRUE(small.evict_page());
  EXPECT_EQ(small.stats().host_pages, 0);
  EXPECT_EQ(small.stats().evicted_snapshots, 1);
  EXPECT_TRUE(small.evict_page());
  EXPECT_EQ(small.stats().host_pages, 1);
  EXPECT_EQ(small.lookup(z, 8).tokens, 0);  // no snapshot anywhere: the page stays on host
  std::vector<std::vector<int32_t>> cached;
  std::vector<int32_t> slots;
  small.owners(cached, slots);
  small.reset();
  EXPECT_EQ(small.stats().host_pages, 0);
  EXPECT_EQ(small.stats().host_bytes, 0);
  expect_no_pages_or_slots_used(pool);
}

TEST(PrefixCacheHostTier, APublisherTakesANodeOnHostBackWithItsOwnPage) {
  PublishedOnPool setup(8);
  auto& [pool, copy, cache, p] = setup;
  while (cache.evict_page()) check(pool, cache);
  // A request that computed the same blocks itself publishes at 8 (a fresh snapshot).
  std::vector<int32_t> pages;
  ASSERT_TRUE(pool.ensure_pages(pages, 13));
  const int32_t snap = pool.alloc_slot();
  EXPECT_TRUE(cache.insert(p.tokens, 8, pages, snap));
  check(pool, cache, {&pages});
  EXPECT_EQ(cache.stats().host_pages, 1);  // block 2 stays on host
  EXPECT_EQ(cache.stats().pages, 2);
  EXPECT_EQ(cache.lookup(p.tokens, 11).snapshot_slot, snap);  // the host one at 8 is replaced
  pool.free_pages(pages);
  // Block 2 comes back under the request's pages, with its snapshot at 12.
  const PrefixHit hit = cache.lookup(p.tokens, 12);
  check(pool, cache);
  EXPECT_EQ(hit.tokens, 12);
  EXPECT_EQ(bytes_of(pool.slot_data(hit.snapshot_slot), kSlotBytes), p.snap12);
  cache.reset();
  expect_no_pages_or_slots_used(pool);
}

TEST(PrefixCacheHostTier, SnapshotsEvictedAloneComeBackFromTheHost) {
  PublishedOnPool setup(8);
  auto& [pool, copy, cache, p] = setup;
  EXPECT_TRUE(cache.evict_snapshot());  // a slot was needed: the snapshots go to the host
  EXPECT_TRUE(cache.evict_snapshot());
  EXPECT_FALSE(cache.evict_snapshot());
  check(pool, cache);
  PrefixCacheStats s = cache.stats();
  EXPECT_EQ(s.snapshots, 0);
  EXPECT_EQ(s.host_snapshots, 2);
  EXPECT_EQ(s.offloaded_snapshots, 2);
  EXPECT_EQ(s.pages, 3);
  EXPECT_EQ(s.host_bytes, 2 * kSlotBytes);
  EXPECT_EQ(pool.usage().slots_used, 0);
  for (int32_t slot = 0; slot < pool.slot_count(); ++slot) {
    fill(pool.slot_data(slot), kSlotBytes, 98);  // the snapshots can only come from the host
  }
  PrefixHit hit = cache.lookup(p.tokens, 12);
  check(pool, cache);
  ASSERT_EQ(hit.tokens, 12);
  EXPECT_EQ(bytes_of(pool.slot_data(hit.snapshot_slot), kSlotBytes), p.snap12);
  EXPECT_EQ(cache.stats().restored_snapshots, 1);
  EXPECT_EQ(cache.stats().host_snapshots, 1);  // the one at 8 stays there until wanted
  // Now every page to the host: the snapshot alone at 8 joins its page's entry.
  while (cache.evict_page()) check(pool, cache);
  s = cache.stats();
  EXPECT_EQ(s.host_pages, 3);
  EXPECT_EQ(s.host_snapshots, 2);
  EXPECT_EQ(s.host_bytes, 3 * kPageBytes + 2 * kSlotBytes);
  scribble(pool);
  hit = cache.lookup(p.tokens, 11);
  check(pool, cache);
  ASSERT_EQ(hit.tokens, 8);
  EXPECT_EQ(bytes_of(pool.slot_data(hit.snapshot_slot), kSlotBytes), p.snap8);
  hit = cache.lookup(p.tokens, 12);
  check(pool, cache);
  ASSERT_EQ(hit.tokens, 12);
  EXPECT_EQ(bytes_of(pool.slot_data(hit.snapshot_slot), kSlotBytes), p.snap12);
  EXPECT_EQ(bytes_of(pool.page_data(hit.pages[2]), kPageBytes), p.page_bytes[2]);
  // A publisher with a fresh snapshot replaces one on the host; dropping it drops either.
  EXPECT_TRUE(cache.evict_snapshot());
  EXPECT_TRUE(cache.evict_snapshot());
  std::vector<int32_t> pages;
  ASSERT_TRUE(pool.ensure_pages(pages, 13));
  EXPECT_TRUE(cache.insert(p.tokens, 8, pages, pool.alloc_slot()));
  check(pool, cache, {&pages});
  EXPECT_EQ(cache.stats().host_snapshots, 1);
  cache.drop_snapshot(p.tokens, 12);
  check(pool, cache, {&pages});
  EXPECT_EQ(cache.stats().host_snapshots, 0);
  pool.free_pages(pages);
  cache.reset();
  check(pool, cache);
  expect_no_pages_or_slots_used(pool);
  EXPECT_EQ(cache.stats().host_bytes, 0);
}

TEST(PrefixCacheHostTier, ResetEmptiesTheHostAndNegativeBudgetsAreErrors) {
  KvPool pool(PoolGeometry{kPage, kPageBytes, kSlotBytes}, 8, 4);
  PoolHostCopy copy(pool);
  EXPECT_THROW(PrefixCache(pool, -1, &copy), Error);
  EXPECT_THROW(PrefixCache(pool, 64, nullptr), Error);
  PrefixCache cache(pool, 1 << 20, &copy);
  const Published p = publish(pool, cache);
  EXPECT_TRUE(cache.evict_page());
  EXPECT_GT(cache.stats().host_bytes, 0);
  cache.reset();
  check(pool, cache);
  EXPECT_EQ(cache.stats().host_pages, 0);
  EXPECT_EQ(cache.stats().host_bytes, 0);
  EXPECT_EQ(cache.lookup(p.tokens, 12).tokens, 0);
  expect_no_pages_or_slots_used(pool);
}

}  // namespace
}  // namespace dsv41rt::engine
