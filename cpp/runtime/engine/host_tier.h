// Host-memory tier of the prefix cache (design: docs/design/prefix-cache.md, "The host tier").
//
// A byte-budgeted store of entries in host memory, least recently used first out: the prefix
// cache copies a page it evicts from the device pool (and the node's snapshot, if it has one) into
// an entry, and copies it back instead of recomputing the prefix when a later request reaches it.
// The store knows nothing of trees or pools: entries are opaque bytes under a key the cache picks.
// Each entry has its own allocation (pinned memory on CUDA through the executor's allocator, where
// an allocation is slow): a freed entry's buffer is kept for the next entry of its size (entries
// come in three sizes: page, page + snapshot, snapshot), and kept buffers count against the budget
// until a put needs their room; clear() frees everything.
//
// Thread-safety: none; owned by the prefix cache on the engine thread.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <unordered_map>
#include <vector>

#include "core/export.h"

namespace dsv41rt::engine {

class DSV41RT_API HostTier {
 public:
  /// Host memory for `bytes` bytes (never null for bytes > 0); the default is plain new[].
  using Allocator = std::function<std::shared_ptr<uint8_t>(int64_t bytes)>;

  /// `budget_bytes` > 0 (0 means no tier: the caller does not build one); throws Error otherwise.
  explicit HostTier(int64_t budget_bytes, Allocator allocator = {});

  /// Makes room for `bytes` by dropping least recently used entries for which `evictable(key)`
  /// holds (their keys are appended to `dropped`), then stores an entry under `key` (not yet
  /// present; throws Error otherwise) and returns its bytes, to be filled by the caller. Null,
  /// dropping nothing, when `bytes` can never fit or the entries it may drop do not free enough.
  uint8_t* put(uint64_t key, int64_t bytes, const std::function<bool(uint64_t)>& evictable,
               std::vector<uint64_t>& dropped);
  /// The entry's bytes; throws Error for an unknown key.
  uint8_t* data(uint64_t key);
  int64_t bytes(uint64_t key) const;
  /// Marks the entry most recently used.
  void touch(uint64_t key);
  /// Frees the entry (throws Error for an unknown key); its buffer is kept for reuse.
  void erase(uint64_t key);
  bool contains(uint64_t key) const { return entries_.count(key) != 0; }
  void clear();

  int64_t budget_bytes() const { return budget_; }
  int64_t used_bytes() const { return used_; }
  /// Host memory allocated: the entries' and the kept buffers' (<= budget_bytes).
  int64_t held_bytes() const { return used_ + spare_bytes_; }
  int64_t entries() const { return int64_t(entries_.size()); }
  /// Keys from least to most recently used (tests, invariant checks).
  std::vector<uint64_t> lru_order() const { return {order_.begin(), order_.end()}; }

 private:
  struct Entry {
    std::shared_ptr<uint8_t> data;
    int64_t bytes = 0;
    std::list<uint64_t>::iterator pos;  // in order_
  };
  const Entry& entry(uint64_t key) const;
  std::shared_ptr<uint8_t> buffer(int64_t bytes);

  int64_t budget_;
  int64_t used_ = 0;
  Allocator allocator_;
  std::list<uint64_t> order_;  // least recently used first
  std::unordered_map<uint64_t, Entry> entries_;
  std::unordered_map<int64_t, std::vector<std::shared_ptr<uint8_t>>> spare_;  // by size
  int64_t spare_bytes_ = 0;
};

}  // namespace dsv41rt::engine
