// The prefix cache's host tier on its own (engine/host_tier.h): the byte-budgeted LRU store, its
// kept buffers, bad input. The cache moving pages and snapshots there and back:
// test_prefix_cache_host.cc.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "core/status.h"
#include "runtime/engine/host_tier.h"

namespace dsv41rt::engine {
namespace {

std::vector<uint8_t> bytes_of(const uint8_t* p, int64_t n) { return {p, p + n}; }

void fill(uint8_t* p, int64_t n, int seed) {
  for (int64_t i = 0; i < n; ++i) p[i] = uint8_t(seed * 37 + i * 11 + 1);
}

const auto kAny = [](uint64_t) { return true; };

TEST(HostTier, EvictsLeastRecentlyUsedToMakeRoom) {
  HostTier tier(100);
  std::vector<uint64_t> dropped;
  ASSERT_NE(tier.put(1, 40, kAny, dropped), nullptr);
  ASSERT_NE(tier.put(2, 40, kAny, dropped), nullptr);
  EXPECT_EQ(tier.used_bytes(), 80);
  ASSERT_NE(tier.put(3, 40, kAny, dropped), nullptr);  // 1 is the least recently used
  EXPECT_EQ(dropped, std::vector<uint64_t>{1});
  tier.touch(2);
  dropped.clear();
  ASSERT_NE(tier.put(4, 40, kAny, dropped), nullptr);  // now 3 is
  EXPECT_EQ(dropped, std::vector<uint64_t>{3});
  EXPECT_EQ(tier.lru_order(), (std::vector<uint64_t>{2, 4}));
  EXPECT_EQ(tier.used_bytes(), 80);
  // Entries the caller spares are skipped; a put that cannot make room changes nothing.
  dropped.clear();
  ASSERT_NE(tier.put(
                5, 60, [](uint64_t k) { return k != 2; }, dropped),
            nullptr);
  EXPECT_EQ(dropped, std::vector<uint64_t>{4});
  dropped.clear();
  EXPECT_EQ(tier.put(
                6, 80, [](uint64_t k) { return k != 2; }, dropped),
            nullptr);
  EXPECT_TRUE(dropped.empty());
  EXPECT_EQ(tier.entries(), 2);
  EXPECT_EQ(tier.used_bytes(), 100);
  // An entry larger than the whole budget never fits and drops nothing.
  EXPECT_EQ(tier.put(7, 101, kAny, dropped), nullptr);
  EXPECT_TRUE(dropped.empty());
  EXPECT_EQ(tier.entries(), 2);
  // The bytes stay where they were written.
  fill(tier.data(2), 40, 2);
  tier.touch(5);
  EXPECT_EQ(bytes_of(tier.data(2), 40)[3], uint8_t(2 * 37 + 3 * 11 + 1));
  tier.erase(2);
  EXPECT_EQ(tier.used_bytes(), 60);
  tier.clear();
  EXPECT_EQ(tier.used_bytes(), 0);
  EXPECT_EQ(tier.entries(), 0);
}

TEST(HostTier, FreedBuffersAreReusedWithinTheBudget) {
  int64_t allocations = 0, allocated = 0;
  HostTier tier(100, [&](int64_t bytes) {
    ++allocations;
    allocated += bytes;
    return std::shared_ptr<uint8_t>(new uint8_t[size_t(bytes)], std::default_delete<uint8_t[]>());
  });
  std::vector<uint64_t> dropped;
  uint8_t* a = tier.put(1, 40, kAny, dropped);
  ASSERT_NE(tier.put(2, 40, kAny, dropped), nullptr);
  tier.erase(1);
  EXPECT_EQ(tier.used_bytes(), 40);
  EXPECT_EQ(tier.held_bytes(), 80);              // entry 1's buffer is kept
  EXPECT_EQ(tier.put(3, 40, kAny, dropped), a);  // and reused: no new allocation
  EXPECT_EQ(allocations, 2);
  // Evicting for room keeps the victim's buffer too: a same-size entry takes it.
  ASSERT_NE(tier.put(4, 40, kAny, dropped), nullptr);  // 2 goes
  EXPECT_EQ(allocations, 2);
  // Another size: kept buffers are freed until the new one fits the budget.
  tier.erase(3);
  ASSERT_NE(tier.put(5, 60, kAny, dropped), nullptr);
  EXPECT_EQ(allocations, 3);
  EXPECT_LE(tier.held_bytes(), 100);
  EXPECT_EQ(tier.used_bytes(), 100);
  tier.clear();
  EXPECT_EQ(tier.held_bytes(), 0);
}

TEST(HostTier, BadInputIsAnError) {
  EXPECT_THROW(HostTier(0), Error);
  EXPECT_THROW(HostTier(-5), Error);
  HostTier tier(10);
  std::vector<uint64_t> dropped;
  ASSERT_NE(tier.put(1, 4, kAny, dropped), nullptr);
  EXPECT_THROW(tier.put(1, 4, kAny, dropped), Error);  // key taken
  EXPECT_THROW(tier.put(2, 0, kAny, dropped), Error);
  EXPECT_THROW(tier.data(9), Error);
  EXPECT_THROW(tier.erase(9), Error);
  EXPECT_THROW(tier.touch(9), Error);
}

// A 13-token request published at 8 and 12 (snapshots at both), its pages and snapshots holding
// distinct bytes; the request has ended.

}  // namespace
}  // namespace dsv41rt::engine
