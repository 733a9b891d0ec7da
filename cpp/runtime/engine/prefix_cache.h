// Prefix cache over the paged KV pool (design: docs/design/prefix-cache.md).
//
// A tree of page-aligned token blocks: the node at depth k is the block of page_tokens tokens at
// positions [(k-1)P, kP) and is reached from the root through the exact tokens of every earlier
// block (children are keyed by the block's tokens, so a hit never depends on a hash). A node
// holds one reference to the token page that request computed for its block (compressed KV and
// index keys: a pure function of the prefix, full and never written again) and, optionally, a
// snapshot: a pool slot holding a copy of the request slot at the boundary kP (window rings of
// the last W positions, pending compressor rows, Engram history). The window rows cannot be
// rebuilt by re-running positions (spec §7.4), so a prefix is usable only up to a node that has a
// snapshot; pages without one wait for a deeper snapshot or for eviction.
//
// Eviction (least recently used first): a page when the pool runs out, taking the leaf whose page
// no request holds (its snapshot goes with it); a snapshot alone when a slot is needed. A page a
// request holds is never evicted: a request holding a node's page holds every ancestor's too.
//
// Thread-safety: none; owned by the scheduler on the engine thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "core/export.h"
#include "runtime/model/kv_pool.h"

namespace dsv41rt::engine {

/// The usable cached prefix of a token sequence.
struct PrefixHit {
  int64_t tokens = 0;          ///< cached positions (a multiple of page_tokens; 0 = miss)
  std::vector<int32_t> pages;  ///< their pages, tokens / page_tokens of them (not yet retained)
  int32_t snapshot_slot = -1;  ///< the slot state at `tokens` (-1 on a miss)
};

struct PrefixCacheStats {
  int64_t queries = 0;            ///< prompt tokens looked up (vLLM's prefix_cache_queries)
  int64_t hits = 0;               ///< of them, tokens served from the cache (prefix_cache_hits)
  int64_t pages = 0;              ///< pages the cache holds a reference on
  int64_t reclaimable_pages = 0;  ///< of them, held by no request (evictable, leaf by leaf)
  int64_t snapshots = 0;          ///< slots holding snapshots
  int64_t evicted_pages = 0, evicted_snapshots = 0;
};

class DSV41RT_API PrefixCache {
 public:
  explicit PrefixCache(model::KvPool& pool);
  ~PrefixCache();
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  int64_t page_tokens() const { return page_tokens_; }

  /// The longest cached prefix of `tokens` of at most `max_tokens` positions that ends at a
  /// snapshot; marks its nodes used.
  PrefixHit lookup(const std::vector<int32_t>& tokens, int64_t max_tokens);
  /// Counts one request's lookup for the stats: `queried` tokens, `hit` of them cached.
  void record_query(int64_t queried, int64_t hit);

  /// Whether a snapshot exists at `boundary` (a multiple of page_tokens) along `tokens`.
  bool has_snapshot(const std::vector<int32_t>& tokens, int64_t boundary) const;

  /// Indexes the first `boundary` positions of `tokens` (a positive multiple of page_tokens)
  /// from `pages`, the publishing request's page table: a new node for block k takes a reference
  /// on pages[k]. Where block k is cached already from another page (a request that computed the
  /// same block itself), the table switches to the cached page and frees its own - equal bytes,
  /// a pure function of the same prefix - so a request holding a node's page holds every
  /// ancestor's too. When `snapshot_slot` >= 0 (allocated from the pool, holding the state at
  /// `boundary`) and the boundary has no snapshot yet, the cache adopts the slot and returns
  /// true; otherwise the caller keeps it.
  bool insert(const std::vector<int32_t>& tokens, int64_t boundary, std::vector<int32_t>& pages,
              int32_t snapshot_slot);

  /// Frees the snapshot at `boundary` along `tokens`, if there is one (a request replacing the
  /// snapshot it took while decoding with a later one).
  void drop_snapshot(const std::vector<int32_t>& tokens, int64_t boundary);

  /// Frees the page of the least recently used leaf no request holds (and its snapshot).
  /// False when there is none.
  bool evict_page();
  /// Frees the least recently used snapshot slot other than `spare`. False when there is none.
  bool evict_snapshot(int32_t spare = -1);
  /// Hands the snapshot slot `slot` over to the caller (a request that starts from it): the cache
  /// forgets it without freeing it. Throws Error when no node holds that snapshot.
  void release_snapshot(int32_t slot);
  /// Forgets everything: every reference and snapshot goes back to the pool (pages that requests
  /// still hold stay with them).
  void reset();

  PrefixCacheStats stats() const;
  /// The cache's page references, one single-page table per node, and its snapshot slots: owners
  /// for KvPool::check_invariants. Also checks the tree's own invariants; throws Error.
  void owners(std::vector<std::vector<int32_t>>& page_tables, std::vector<int32_t>& slots) const;

 private:
  struct Node;
  Node* child(const Node& parent, const int32_t* block) const;
  void touch(Node& n);
  void erase_leaf(Node* n);

  model::KvPool& pool_;
  int64_t page_tokens_;
  std::unique_ptr<Node> root_;
  uint64_t clock_ = 0;
  PrefixCacheStats stats_;
};

}  // namespace dsv41rt::engine
