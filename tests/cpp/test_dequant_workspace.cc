// Validity rules of the per-ratio dequant workspaces: each invalidation rule on its own, and the
// released V4.1-Flash schedule's counts (4 dequantisations per forward with reuse, 38 without).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "core/status.h"
#include "runtime/dequant_workspace.h"

namespace dsv41rt {
namespace {

struct Recorder {
  int fills = 0;
  int64_t last_rows = -1;
  DequantWorkspaces::Fill fill(float value) {
    return [this, value](void* dst, int64_t rows) {
      ++fills;
      last_rows = rows;
      auto* f = static_cast<float*>(dst);
      for (int64_t i = 0; i < rows; ++i) f[i] = value;
    };
  }
};

constexpr int64_t kRow = sizeof(float);

TEST(DequantWorkspace, SharedSourceIsReusedWithinAForward) {
  DequantWorkspaces ws;
  Recorder r;
  ws.begin_forward();
  ws.note_source_write(2);
  float* a = static_cast<float*>(ws.acquire(2, 2, 10, kRow, r.fill(1)));
  float* b = static_cast<float*>(ws.acquire(2, 2, 10, kRow, r.fill(2)));
  EXPECT_EQ(r.fills, 1);
  EXPECT_EQ(a, b);
  EXPECT_EQ(b[9], 1.0f);  // contents of the first fill, not refilled
  EXPECT_EQ(ws.counters().dequant_calls, 1);
  EXPECT_EQ(ws.counters().reuse_hits, 1);
}

TEST(DequantWorkspace, SourceUpdateInvalidates) {
  DequantWorkspaces ws;
  Recorder r;
  ws.begin_forward();
  ws.acquire(1, 20, 8, kRow, r.fill(1));
  ws.note_source_write(20);  // the producer appended entries
  ws.acquire(1, 20, 8, kRow, r.fill(2));
  EXPECT_EQ(r.fills, 2);
  ws.note_source_write(7);  // another source's write does not matter
  ws.acquire(1, 20, 8, kRow, r.fill(3));
  EXPECT_EQ(r.fills, 2);
}

TEST(DequantWorkspace, SourceChangeInvalidates) {
  DequantWorkspaces ws;
  Recorder r;
  ws.begin_forward();
  ws.acquire(2, 2, 8, kRow, r.fill(1));
  ws.acquire(2, 8, 8, kRow, r.fill(2));  // next ratio-2 group: another source
  ws.acquire(2, 2, 8, kRow, r.fill(3));  // back to the first source: its rows were overwritten
  EXPECT_EQ(r.fills, 3);
}

TEST(DequantWorkspace, RatiosInterleaveWithoutEvictingEachOther) {
  DequantWorkspaces ws;
  Recorder r;
  ws.begin_forward();
  ws.acquire(2, 14, 6, kRow, r.fill(1));
  ws.acquire(1, 20, 12, kRow, r.fill(2));
  ws.acquire(2, 14, 6, kRow, r.fill(3));
  ws.acquire(1, 20, 12, kRow, r.fill(4));
  EXPECT_EQ(r.fills, 2);
  EXPECT_EQ(ws.counters().reuse_hits, 2);
}

TEST(DequantWorkspace, ConsecutiveForwardsRefill) {
  DequantWorkspaces ws;
  Recorder r;
  for (int f = 0; f < 3; ++f) {
    ws.begin_forward();
    ws.acquire(2, 2, 4, kRow, r.fill(1));
    ws.acquire(2, 2, 4, kRow, r.fill(1));
  }
  EXPECT_EQ(r.fills, 3);
  EXPECT_EQ(ws.counters().reuse_hits, 3);
}

TEST(DequantWorkspace, GrowthReallocatesAndRefillsShrinkKeepsCoveredRows) {
  DequantWorkspaces ws;
  Recorder r;
  ws.begin_forward();
  ws.acquire(1, 20, 4, kRow, r.fill(1));
  ws.acquire(1, 20, 16, kRow, r.fill(2));  // more rows than covered and than allocated
  EXPECT_EQ(r.fills, 2);
  EXPECT_EQ(ws.counters().reallocations, 2);
  ws.acquire(1, 20, 3, kRow, r.fill(3));  // fewer rows: still covered
  EXPECT_EQ(r.fills, 2);
  ws.shrink_to_fit(1);  // storage replaced: contents gone
  EXPECT_EQ(ws.allocated_bytes(), 3 * kRow);
  ws.acquire(1, 20, 3, kRow, r.fill(4));
  EXPECT_EQ(r.fills, 3);
  EXPECT_EQ(r.last_rows, 3);
}

TEST(DequantWorkspace, ReuseOffAlwaysRefills) {
  DequantWorkspaces ws(DequantWorkspaces::host_allocator(), /*reuse=*/false);
  Recorder r;
  ws.begin_forward();
  for (int i = 0; i < 5; ++i) ws.acquire(2, 2, 4, kRow, r.fill(1));
  EXPECT_EQ(r.fills, 5);
  EXPECT_EQ(ws.counters().reuse_hits, 0);
}

TEST(DequantWorkspace, BadRequestThrows) {
  DequantWorkspaces ws;
  Recorder r;
  EXPECT_THROW(ws.acquire(0, 2, 4, kRow, r.fill(1)), Error);
  EXPECT_THROW(ws.acquire(2, -1, 4, kRow, r.fill(1)), Error);
}

// The released V4.1-Flash schedule: ratio-2 layers 2-19 (sources 2, 8, 14), ratio-1 layers
// 20-39 (source 20). Each forward: the producer writes, then every compressed layer consumes.
int64_t released_trace_dequants(bool reuse, int forwards) {
  DequantWorkspaces ws(DequantWorkspaces::host_allocator(), reuse);
  const int sources[] = {2, 8, 14, 20};
  int64_t rows = 64;
  for (int f = 0; f < forwards; ++f) {
    ws.begin_forward();
    rows += 3;  // each forward processes new tokens: more entries
    for (int layer = 2; layer < 40; ++layer) {
      const int ratio = layer < 20 ? 2 : 1;
      int source = 0;
      for (int s : sources) source = s <= layer ? s : source;
      if (layer == source) ws.note_source_write(source);
      ws.acquire(ratio, source, rows / ratio, 288, [](void*, int64_t) {});
    }
  }
  return ws.counters().dequant_calls;
}

TEST(DequantWorkspace, ReleasedScheduleCounts) {
  EXPECT_EQ(released_trace_dequants(true, 1), 4);
  EXPECT_EQ(released_trace_dequants(true, 6), 24);
  EXPECT_EQ(released_trace_dequants(false, 6), 228);
}

}  // namespace
}  // namespace dsv41rt
