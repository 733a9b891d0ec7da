// The grouped GEMM's tile table (gemm_wgmma.cuh: rows group / first row / group end, max_tiles
// apart) for groups of `counts` rows stacked in order, cut into `tile_m`-row tiles, with two unused
// entries past the used ones and three spare columns (as moe_grouped sizes it for the worst case).
#pragma once

#include <cstdint>
#include <vector>

namespace dsv41rt::testing {

struct GroupedTileTable {
  std::vector<int32_t> table;  // 3 * max_tiles, -1 where unused
  int64_t m = 0;               // rows of all groups
  int64_t entries = 0;         // entries the kernel reads
  int64_t max_tiles = 0;       // the table's row stride
};

inline GroupedTileTable grouped_tile_table(const std::vector<int32_t>& counts, int64_t tile_m) {
  std::vector<int32_t> group, row0, row_end;
  int32_t m = 0;
  for (size_t e = 0; e < counts.size(); ++e) {
    for (int32_t r = 0; r < counts[e]; r += int32_t(tile_m)) {
      group.push_back(int32_t(e)), row0.push_back(m + r), row_end.push_back(m + counts[e]);
    }
    m += counts[e];
  }
  GroupedTileTable t;
  t.m = m;
  t.entries = int64_t(group.size()) + 2;
  t.max_tiles = t.entries + 3;
  t.table.assign(size_t(3 * t.max_tiles), -1);
  for (size_t i = 0; i < group.size(); ++i) {
    t.table[i] = group[i];
    t.table[size_t(t.max_tiles) + i] = row0[i];
    t.table[size_t(2 * t.max_tiles) + i] = row_end[i];
  }
  return t;
}

}  // namespace dsv41rt::testing
