// KvPool: geometry and capacity, budget sizing, all-or-nothing page growth, double-free detection,
// the invariant checker (hand-made violations) and describe().
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <vector>

#include "core/status.h"
#include "runtime/model/kv_pool.h"

namespace dsv41rt::model {
namespace {

constexpr PoolGeometry kGeom{/*page_tokens=*/64, /*page_bytes=*/1000, /*slot_bytes=*/5000};

TEST(KvPool, GeometryAndCapacity) {
  KvPool pool(kGeom, 10, 3);
  EXPECT_EQ(pool.geometry().page_tokens, 64);
  const PoolUsage u = pool.usage();
  EXPECT_EQ(u.pages_total, 10);
  EXPECT_EQ(u.pages_used, 0);
  EXPECT_EQ(u.slots_total, 3);
  EXPECT_EQ(u.slots_used, 0);
  EXPECT_EQ(u.bytes_total, 10 * 1000 + 3 * 5000);
  EXPECT_EQ(pool.free_page_count(), 10);
  EXPECT_EQ(pool.free_slot_count(), 3);
  EXPECT_EQ(pool.pages_for(0), 0);
  EXPECT_EQ(pool.pages_for(1), 1);
  EXPECT_EQ(pool.pages_for(64), 1);
  EXPECT_EQ(pool.pages_for(65), 2);
  EXPECT_THROW(pool.pages_for(-1), Error);
  EXPECT_THROW(KvPool(PoolGeometry{0, 10, 10}, 1, 1), Error);
  EXPECT_THROW(KvPool(kGeom, -1, 1), Error);
}

TEST(KvPool, SlotsAndPagesAreDistinctWritableStorage) {
  KvPool pool(kGeom, 4, 2);
  std::set<const uint8_t*> seen;
  for (int32_t p = 0; p < 4; ++p) {
    std::memset(pool.page_data(p), p + 1, kGeom.page_bytes);
    seen.insert(pool.page_data(p));
  }
  for (int32_t s = 0; s < 2; ++s) {
    std::memset(pool.slot_data(s), 0x40 + s, kGeom.slot_bytes);
    seen.insert(pool.slot_data(s));
  }
  EXPECT_EQ(seen.size(), 6u);
  for (int32_t p = 0; p < 4; ++p) {
    const KvPool& cp = pool;
    EXPECT_EQ(cp.page_data(p)[0], p + 1);
    EXPECT_EQ(cp.page_data(p)[kGeom.page_bytes - 1], p + 1);
  }
  EXPECT_EQ(pool.slot_data(1)[kGeom.slot_bytes - 1], 0x41);
  EXPECT_THROW(pool.page_data(4), Error);
  EXPECT_THROW(pool.slot_data(-1), Error);
}

TEST(KvPool, CustomAllocatorIsUsed) {
  std::vector<int64_t> requests;
  KvPool::Allocator alloc = [&](int64_t bytes) {
    requests.push_back(bytes);
    return std::shared_ptr<uint8_t>(new uint8_t[bytes], std::default_delete<uint8_t[]>());
  };
  KvPool pool(kGeom, 7, 2, alloc);
  std::sort(requests.begin(), requests.end());
  EXPECT_EQ(requests, (std::vector<int64_t>{7000, 10000}));
  KvPool::Allocator null_alloc = [](int64_t) { return std::shared_ptr<uint8_t>(); };
  EXPECT_THROW(KvPool(kGeom, 1, 1, null_alloc), Error);
}

TEST(KvPool, SlotAllocationAndDoubleFree) {
  KvPool pool(kGeom, 1, 2);
  const int32_t a = pool.alloc_slot();
  const int32_t b = pool.alloc_slot();
  EXPECT_NE(a, b);
  EXPECT_GE(a, 0);
  EXPECT_GE(b, 0);
  EXPECT_EQ(pool.alloc_slot(), -1);
  EXPECT_EQ(pool.usage().slots_used, 2);
  pool.free_slot(a);
  EXPECT_THROW(pool.free_slot(a), Error);  // double free
  EXPECT_THROW(pool.free_slot(7), Error);  // out of range
  EXPECT_EQ(pool.alloc_slot(), a);         // LIFO
  pool.free_slot(a);
  pool.free_slot(b);
  EXPECT_EQ(pool.free_slot_count(), 2);
}

TEST(KvPool, FromBudgetArithmetic) {
  // Room for all 4 slots: 4 * 5000 = 20000, the rest (31500) is 31 pages.
  KvPool a = KvPool::from_budget(kGeom, 51500, 4);
  EXPECT_EQ(a.usage().slots_total, 4);
  EXPECT_EQ(a.usage().pages_total, 31);
  EXPECT_LE(a.usage().bytes_total, 51500);
  // Budget for fewer slots than asked: keep one page, as many slots as fit.
  KvPool b = KvPool::from_budget(kGeom, 12500, 8);
  EXPECT_EQ(b.usage().slots_total, 2);  // (12500 - 1000) / 5000
  EXPECT_EQ(b.usage().pages_total, 2);  // (12500 - 10000) / 1000
  // Exactly one slot and one page.
  KvPool c = KvPool::from_budget(kGeom, 6000, 3);
  EXPECT_EQ(c.usage().slots_total, 1);
  EXPECT_EQ(c.usage().pages_total, 1);
}

TEST(KvPool, FromBudgetTooSmallNamesTheShortfall) {
  try {
    KvPool::from_budget(kGeom, 5999, 3);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), StatusCode::kOutOfRange);
    const std::string m = e.message();
    EXPECT_NE(m.find("5999"), std::string::npos) << m;
    EXPECT_NE(m.find("6000"), std::string::npos) << m;
  }
  EXPECT_THROW(KvPool::from_budget(kGeom, 100000, 0), Error);
}

TEST(KvPool, EnsurePagesIsAllOrNothing) {
  KvPool pool(PoolGeometry{4, 16, 16}, 5, 1);
  std::vector<int32_t> a, b;
  ASSERT_TRUE(pool.ensure_pages(a, 9));  // 3 pages
  EXPECT_EQ(a.size(), 3u);
  ASSERT_TRUE(pool.ensure_pages(a, 12));  // still 3
  EXPECT_EQ(a.size(), 3u);
  ASSERT_TRUE(pool.ensure_pages(a, 4));  // never shrinks
  EXPECT_EQ(a.size(), 3u);
  const std::vector<int32_t> before = a;
  ASSERT_TRUE(pool.ensure_pages(b, 1));
  EXPECT_FALSE(pool.ensure_pages(a, 21));  // needs 3 more, 1 free
  EXPECT_EQ(a, before);
  EXPECT_EQ(pool.free_page_count(), 1);
  ASSERT_TRUE(pool.ensure_pages(a, 13));  // exactly the last page
  EXPECT_EQ(pool.free_page_count(), 0);
  std::set<int32_t> all(a.begin(), a.end());
  all.insert(b.begin(), b.end());
  EXPECT_EQ(all.size(), 5u);
  pool.check_invariants({&a, &b}, {});
  pool.free_pages(a);
  EXPECT_TRUE(a.empty());
  pool.free_pages(b);
  EXPECT_EQ(pool.free_page_count(), 5);
  pool.check_invariants({}, {});
}

TEST(KvPool, DoubleFreeOfPagesThrowsAndLeavesThePoolIntact) {
  KvPool pool(PoolGeometry{4, 8, 8}, 4, 1);
  std::vector<int32_t> a;
  ASSERT_TRUE(pool.ensure_pages(a, 8));
  std::vector<int32_t> copy = a;
  pool.free_pages(a);
  EXPECT_THROW(pool.free_pages(copy), Error);
  EXPECT_EQ(copy.size(), 2u);  // untouched on error
  EXPECT_EQ(pool.free_page_count(), 4);
  // A table mixing a live page with a free one: nothing is freed.
  std::vector<int32_t> live;
  ASSERT_TRUE(pool.ensure_pages(live, 4));
  std::vector<int32_t> mixed = {live[0], copy[0] == live[0] ? copy[1] : copy[0]};
  EXPECT_THROW(pool.free_pages(mixed), Error);
  EXPECT_EQ(pool.free_page_count(), 3);
  std::vector<int32_t> dup = {live[0], live[0]};
  EXPECT_THROW(pool.free_pages(dup), Error);
  EXPECT_EQ(pool.free_page_count(), 3);
  pool.check_invariants({&live}, {});
}

TEST(KvPool, InvariantsCatchAPageOwnedTwice) {
  KvPool pool(PoolGeometry{4, 8, 8}, 4, 2);
  std::vector<int32_t> a, b;
  ASSERT_TRUE(pool.ensure_pages(a, 8));
  b.push_back(a[1]);  // b claims a's page
  a.pop_back();
  try {
    pool.check_invariants({&a, &b, &b}, {});
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.message()).find("owned twice"), std::string::npos) << e.message();
  }
  const int32_t s = pool.alloc_slot();
  EXPECT_THROW(pool.check_invariants({&a, &b}, {s, s}), Error);
  pool.check_invariants({&a, &b}, {s});
}

TEST(KvPool, InvariantsCatchLeaksAndUnallocatedOwners) {
  KvPool pool(PoolGeometry{4, 8, 8}, 4, 2);
  std::vector<int32_t> a, leaked;
  ASSERT_TRUE(pool.ensure_pages(a, 4));
  ASSERT_TRUE(pool.ensure_pages(leaked, 4));
  try {
    pool.check_invariants({&a}, {});  // `leaked` is allocated but no owner lists it
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.message()).find("leak"), std::string::npos) << e.message();
  }
  pool.check_invariants({&a, &leaked}, {});
  // An owner listing a free page.
  std::vector<int32_t> phantom;
  for (int32_t p = 0; p < 4; ++p) {
    if (p != a[0] && p != leaked[0]) phantom = {p};
  }
  EXPECT_THROW(pool.check_invariants({&a, &leaked, &phantom}, {}), Error);
  std::vector<int32_t> out_of_range = {99};
  EXPECT_THROW(pool.check_invariants({&a, &leaked, &out_of_range}, {}), Error);
  // Slots: a leaked slot, and a listed slot that is free.
  const int32_t s = pool.alloc_slot();
  EXPECT_THROW(pool.check_invariants({&a, &leaked}, {}), Error);
  EXPECT_THROW(pool.check_invariants({&a, &leaked}, {s, 1 - s}), Error);
  pool.check_invariants({&a, &leaked}, {s});
}

TEST(KvPool, Describe) {
  KvPool pool(PoolGeometry{64, 1 << 20, 1 << 19}, 100, 16);
  // 100 MiB of pages + 8 MiB of slots.
  EXPECT_EQ(pool.describe(),
            "KV pool: 100 pages x 64 tokens = 6400 tokens, 16 request slots, 108.0 MiB");
}

TEST(KvPool, ZeroByteGeometryIsAccountingOnly) {
  KvPool pool(PoolGeometry{16, 0, 0}, 3, 2);
  std::vector<int32_t> t;
  ASSERT_TRUE(pool.ensure_pages(t, 48));
  EXPECT_FALSE(pool.ensure_pages(t, 49));
  EXPECT_EQ(pool.usage().bytes_total, 0);
  pool.free_pages(t);
}

}  // namespace
}  // namespace dsv41rt::model
