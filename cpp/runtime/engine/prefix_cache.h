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
// Host tier (host_tier.h; off unless given a byte budget): an evicted page and the snapshot at its
// end are copied into host memory instead of being forgotten, and the node stays in the tree "on
// host" (no device page, no slot); a snapshot evicted alone (a slot was needed) goes there too,
// its node keeping its page. A lookup that runs through nodes on host copies them back into
// fresh pages (ancestors first) and, for the node the hit ends at, its snapshot into a fresh slot;
// when the pool has no page to give, the hit stops at the last node it could bring back. Resident
// nodes form a subtree holding the root (a resident node's parent is resident), so the device
// eviction still takes only nodes without resident children, and the host tier dropping an entry
// takes the node's whole subtree, which is all on host.
//
// Thread-safety: none; owned by the scheduler on the engine thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <unordered_map>
#include <vector>

#include "core/export.h"
#include "runtime/engine/host_tier.h"
#include "runtime/model/host_state_copy.h"
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
  int64_t host_pages = 0;           ///< nodes on the host tier (their pages are not in the pool)
  int64_t host_snapshots = 0;       ///< snapshots on the host tier (with their page or alone)
  int64_t host_bytes = 0;           ///< host-tier bytes in use
  int64_t offloaded_pages = 0;      ///< evicted pages copied to the host tier (total)
  int64_t restored_pages = 0;       ///< pages copied back from the host tier (total)
  int64_t offloaded_snapshots = 0;  ///< evicted snapshots alone copied to the host tier (total)
  int64_t restored_snapshots = 0;   ///< snapshots copied back from the host tier (total)
};

class DSV41RT_API PrefixCache {
 public:
  /// `host_bytes` > 0 turns the host tier on (then `copy`, which moves pool storage to and from
  /// the host, is required and must outlive the cache); 0 = off.
  explicit PrefixCache(model::KvPool& pool, int64_t host_bytes = 0,
                       model::HostStateCopy* copy = nullptr);
  ~PrefixCache();
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  int64_t page_tokens() const { return page_tokens_; }

  /// The longest cached prefix of `tokens` of at most `max_tokens` positions that ends at a
  /// snapshot; marks its nodes used. Nodes on the host tier along the way are brought back into
  /// pool pages (and the hit's snapshot into a slot), evicting other unreferenced cached pages if
  /// needed; the hit stops at the last node that could be brought back.
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

  /// Frees the page of the least recently used node without resident children that no request
  /// holds (and its snapshot), moving both to the host tier when it is on. False when there is
  /// none.
  bool evict_page();
  /// Frees the least recently used snapshot slot other than `spare`. False when there is none.
  bool evict_snapshot(int32_t spare = -1);
  /// Hands the snapshot slot `slot` over to the caller (a request that starts from it): the cache
  /// forgets it without freeing it. Throws Error when no node holds that snapshot.
  void release_snapshot(int32_t slot);
  /// Forgets everything: every reference and snapshot goes back to the pool (pages that requests
  /// still hold stay with them), and the host tier is emptied.
  void reset();

  PrefixCacheStats stats() const;
  /// The cache's page references, one single-page table per node, and its snapshot slots: owners
  /// for KvPool::check_invariants. Also checks the tree's own invariants; throws Error.
  void owners(std::vector<std::vector<int32_t>>& page_tables, std::vector<int32_t>& slots) const;

 private:
  struct Node;
  Node* child(const Node& parent, const int32_t* block) const;
  void touch(Node& n);
  void erase_subtree(Node* n);
  // Host tier (prefix_cache_host.cc).
  uint8_t* put_entry(Node* n, int64_t bytes, uint64_t& key);
  bool offload(Node* n);
  bool offload_snapshot(Node* n);
  int32_t slot_for_restore(bool evict);
  bool restore(Node* n, bool want_snapshot);
  bool restore_snapshot(Node* n);
  void forget_host(Node* n);
  void restore_path(const std::vector<Node*>& path);
  void check_host(const Node& n) const;

  model::KvPool& pool_;
  int64_t page_tokens_;
  std::unique_ptr<Node> root_;
  uint64_t clock_ = 0;
  PrefixCacheStats stats_;
  model::HostStateCopy* copy_ = nullptr;
  std::unique_ptr<HostTier> tier_;                  // null when the host tier is off
  std::unordered_map<uint64_t, Node*> host_nodes_;  // host-tier key -> node on host
  uint64_t next_host_key_ = 0;
};

}  // namespace dsv41rt::engine
