// The paged state pool of one executor (design: docs/architecture.md, "Engine").
//
// Two kinds of storage, both carved from one memory budget:
//   - request slots: the fixed-size per-request state (every layer's window ring, the compressor's
//     pending tokens, the Engram history). One slot per running request.
//   - token pages: the state that grows with context length. A page covers `page_tokens`
//     consecutive positions of one request and holds, for every KV source, the compressed-KV
//     entries and index keys of those positions (page_tokens is a multiple of every compression
//     ratio, so a page boundary never splits a compression group).
// A request owns one slot and a page table (page ids in position order). The pool only hands out
// and takes back storage; what lives inside a slot or page is the executor's layout.
// Pages are reference counted: a full page whose contents no longer change (a cached prefix,
// engine/prefix_cache.h) may sit in several page tables at once, and goes back to the free list
// when the last table holding it frees it.
//
// Thread-safety: none; the engine thread owns the pool.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/export.h"

namespace dsv41rt::model {

struct PoolGeometry {
  int64_t page_tokens = 0;  ///< positions per token page (multiple of every compression ratio)
  int64_t page_bytes = 0;   ///< bytes of one token page
  int64_t slot_bytes = 0;   ///< bytes of one request slot
};

struct PoolUsage {
  int64_t pages_total = 0, pages_used = 0;
  int64_t slots_total = 0, slots_used = 0;
  int64_t bytes_total = 0;  ///< pages_total * page_bytes + slots_total * slot_bytes
};

class DSV41RT_API KvPool {
 public:
  /// Storage for `bytes` bytes; the default is host memory.
  using Allocator = std::function<std::shared_ptr<uint8_t>(int64_t bytes)>;

  KvPool(PoolGeometry geometry, int64_t num_pages, int64_t num_slots, Allocator allocator = {});

  /// Sizes a pool from a byte budget: `max_slots` slots (all of them if the budget allows), the
  /// rest as pages. Throws Error naming the shortfall if not even one slot and one page fit.
  static KvPool from_budget(PoolGeometry geometry, int64_t budget_bytes, int64_t max_slots,
                            Allocator allocator = {});

  const PoolGeometry& geometry() const { return geometry_; }

  /// A free slot id, or -1 when every slot is taken.
  int32_t alloc_slot();
  /// Returns a slot; throws Error if it is not currently allocated (double free).
  void free_slot(int32_t slot);

  /// Pages needed to hold `tokens` positions.
  int64_t pages_for(int64_t tokens) const;
  /// Grows `table` so it covers `tokens` positions. All or nothing: returns false and leaves
  /// `table` unchanged when too few pages are free.
  bool ensure_pages(std::vector<int32_t>& table, int64_t tokens);
  /// Drops one reference to every page of `table` (a page is free once none is left) and clears
  /// it; throws Error, leaving the pool untouched, on a page that is not allocated or that the
  /// table lists twice.
  void free_pages(std::vector<int32_t>& table);
  /// Adds one reference to each of `pages` (allocated, each listed once): the caller's table now
  /// holds them too and must free them like its own. Throws Error, changing nothing, otherwise.
  void retain_pages(const std::vector<int32_t>& pages);
  /// References held on `page` (0 = free); throws Error when out of range.
  int32_t page_refs(int32_t page) const;

  uint8_t* page_data(int32_t page);
  uint8_t* slot_data(int32_t slot);
  const uint8_t* page_data(int32_t page) const;
  const uint8_t* slot_data(int32_t slot) const;

  /// Pages and slots of the pool (fixed at construction; safe to read from any thread).
  int64_t page_count() const { return int64_t(page_refs_.size()); }
  int64_t slot_count() const { return int64_t(slot_used_.size()); }
  int64_t free_page_count() const;
  int64_t free_slot_count() const;
  PoolUsage usage() const;

  /// Verifies the pool against the live owners: every page of every table is allocated and held
  /// by exactly as many tables as it has references, every listed slot is allocated and owned
  /// once, and the used counts equal the sums over the owners.
  /// Throws Error describing the first violation.
  void check_invariants(const std::vector<const std::vector<int32_t>*>& page_tables,
                        const std::vector<int32_t>& slots) const;

  /// One line: capacity in tokens and requests, bytes.
  std::string describe() const;

 private:
  PoolGeometry geometry_;
  std::shared_ptr<uint8_t> pages_, slots_;
  std::vector<int32_t> free_pages_, free_slots_;  // stacks of free ids
  std::vector<int32_t> page_refs_;                // 0 = free
  std::vector<uint8_t> slot_used_;
};

}  // namespace dsv41rt::model
