// HostRegistry (runtime/model/host_registration.h): the page bookkeeping behind registering a
// checkpoint's Engram tables for the device once per process, with a fake register call that
// records which pages are registered and refuses a page registered twice (as cudaHostRegister
// does).
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "runtime/model/host_registration.h"

namespace dsv41rt::model {
namespace {

constexpr size_t kPage = 4096;

struct FakeDriver {
  std::map<uintptr_t, size_t> live;           // base -> bytes
  int registrations = 0, failures_left = -1;  // -1: never fail

  bool reg(void* base, size_t bytes) {
    const uintptr_t b = reinterpret_cast<uintptr_t>(base);
    EXPECT_EQ(b % kPage, 0u);
    EXPECT_EQ(bytes % kPage, 0u);
    for (const auto& [lb, lbytes] : live) {
      EXPECT_FALSE(b < lb + lbytes && lb < b + bytes) << "page registered twice";
    }
    if (failures_left == 0) return false;
    if (failures_left > 0) --failures_left;
    live[b] = bytes;
    ++registrations;
    return true;
  }
  void unreg(void* base) {
    EXPECT_EQ(live.erase(reinterpret_cast<uintptr_t>(base)), 1u) << "unregistered twice";
  }
  HostRegistry registry() {
    return HostRegistry(
        kPage, [this](void* b, size_t n) { return reg(b, n); }, [this](void* b) { unreg(b); });
  }
  size_t pages() const {
    size_t n = 0;
    for (const auto& [b, bytes] : live) n += bytes / kPage;
    return n;
  }
};

// A fake address range: only its addresses are used, never dereferenced.
const char* at(uintptr_t offset) {
  return reinterpret_cast<const char*>(uintptr_t(1) << 40) + offset;
}

TEST(HostRegistry, RangesArePageAlignedAndSharedPagesRegisteredOnce) {
  FakeDriver d;
  HostRegistry r = d.registry();
  // A table of 3.5 pages, then its scales starting inside its last page (as in a safetensors file).
  auto table = r.cover(at(100), 3 * kPage + kPage / 2);
  ASSERT_EQ(table.size(), 1u);
  EXPECT_EQ(d.pages(), 4u);  // pages 0..3
  auto scales = r.cover(at(3 * kPage + kPage / 2 + 100), 2 * kPage);
  ASSERT_EQ(scales.size(), 2u);  // page 3 (the table's span) + pages 4..5 (new)
  EXPECT_EQ(d.pages(), 6u);
  EXPECT_EQ(d.registrations, 2);
  // A virtual rank asking for the same table again registers nothing.
  auto again = r.cover(at(100), 3 * kPage + kPage / 2);
  EXPECT_EQ(d.registrations, 2);
  EXPECT_EQ(again.size(), 1u);
  EXPECT_EQ(r.registered_pages(), 6u);
}

TEST(HostRegistry, ARangeAcrossSeveralSpansRegistersOnlyItsGaps) {
  FakeDriver d;
  HostRegistry r = d.registry();
  auto a = r.cover(at(2 * kPage), kPage);  // page 2
  auto b = r.cover(at(5 * kPage), kPage);  // page 5
  auto all = r.cover(at(0), 8 * kPage);    // pages 0..7: gaps 0-1, 3-4, 6-7
  EXPECT_EQ(all.size(), 5u);
  EXPECT_EQ(d.registrations, 5);
  EXPECT_EQ(d.pages(), 8u);
}

TEST(HostRegistry, TheLastOwnerUnregistersAndPagesCanBeRegisteredAgain) {
  FakeDriver d;
  HostRegistry r = d.registry();
  {
    auto first = r.cover(at(0), kPage);
    {
      auto second = r.cover(at(0), kPage);
      EXPECT_EQ(d.registrations, 1);
    }
    EXPECT_EQ(d.pages(), 1u);  // `first` still holds it
  }
  EXPECT_EQ(d.pages(), 0u);
  EXPECT_EQ(r.registered_pages(), 0u);
  auto again = r.cover(at(0), kPage);  // registered anew, not a double registration
  EXPECT_EQ(d.registrations, 2);
  EXPECT_EQ(d.pages(), 1u);
}

TEST(HostRegistry, AFailedRegistrationLeavesNothingNewRegistered) {
  FakeDriver d;
  HostRegistry r = d.registry();
  auto held = r.cover(at(2 * kPage), kPage);  // page 2
  d.failures_left = 1;                        // the first gap registers, the second fails
  EXPECT_TRUE(r.cover(at(0), 5 * kPage).empty());
  EXPECT_EQ(d.pages(), 1u);  // only page 2, still held
  EXPECT_EQ(r.registered_pages(), 1u);
  EXPECT_TRUE(r.cover(nullptr, 10).empty());
  EXPECT_TRUE(r.cover(at(0), 0).empty());
  EXPECT_THROW(HostRegistry(3000, nullptr, nullptr), std::exception);
}

// A copy's source cut where registrations begin and end (cudaMemcpy refuses a source that
// straddles a registration's edge): the tensors around a registered table share its edge pages.
TEST(HostRegistry, PiecesCutACopyAtTheEdgesOfLiveSpans) {
  using Pieces = std::vector<std::pair<size_t, size_t>>;
  FakeDriver d;
  HostRegistry r = d.registry();
  EXPECT_EQ(r.pieces(at(10), 100), (Pieces{{0, 100}}));  // nothing registered: one piece
  auto a = r.cover(at(kPage + 5), 2 * kPage);            // pages 1..3, one span
  auto b = r.cover(at(5 * kPage), 10);                   // page 5
  // From page 0 to the middle of page 6: outside, span [1, 4), outside, span [5, 6), outside.
  const size_t from = 100, to = 6 * kPage + 7;
  EXPECT_EQ(r.pieces(at(from), to - from), (Pieces{{0, kPage - from},
                                                   {kPage - from, 3 * kPage},
                                                   {4 * kPage - from, kPage},
                                                   {5 * kPage - from, kPage},
                                                   {6 * kPage - from, 7}}));
  // Inside one span: one piece; starting inside a span and leaving it: cut at its end.
  EXPECT_EQ(r.pieces(at(2 * kPage), 50), (Pieces{{0, 50}}));
  EXPECT_EQ(r.pieces(at(3 * kPage + 1), kPage), (Pieces{{0, kPage - 1}, {kPage - 1, 1}}));
  b.clear();  // an expired span no longer cuts
  EXPECT_EQ(r.pieces(at(4 * kPage), 2 * kPage), (Pieces{{0, 2 * kPage}}));
  EXPECT_TRUE(r.pieces(at(0), 0).empty());
}

}  // namespace
}  // namespace dsv41rt::model
