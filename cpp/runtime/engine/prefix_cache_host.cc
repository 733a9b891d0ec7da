// The prefix cache's host tier (see prefix_cache.h, host_tier.h): moving a node's page and
// snapshot to host memory when the device pool evicts it, and back when a lookup reaches it.
#include <vector>

#include "core/status.h"
#include "runtime/engine/prefix_cache.h"
#include "runtime/engine/prefix_cache_node.h"

namespace dsv41rt::engine {

// Copies `n`'s page (and snapshot) into a new host entry and gives both back to the pool. False,
// changing nothing, when the entry cannot fit (the caller then forgets the node).
bool PrefixCache::offload(Node* n) {
  const bool with_snapshot = n->snapshot >= 0;
  const int64_t page_bytes = copy_->page_bytes();
  const int64_t bytes = page_bytes + (with_snapshot ? copy_->slot_state_bytes() : 0);
  const uint64_t key = ++next_host_key_;
  std::vector<uint64_t> dropped;
  // Entries of nodes a lookup is bringing back are spared; every other node on host can go with
  // its subtree (all on host too).
  uint8_t* data = tier_->put(
      key, bytes, [this](uint64_t k) { return !host_nodes_.at(k)->pinned; }, dropped);
  if (!data) return false;
  for (uint64_t k : dropped) {
    auto it = host_nodes_.find(k);
    if (it == host_nodes_.end()) continue;  // went with an ancestor's subtree already
    erase_subtree(it->second);
  }
  copy_->page_to_host(n->page, data);
  if (with_snapshot) copy_->slot_to_host(n->snapshot, data + page_bytes);
  std::vector<int32_t> table{n->page};
  pool_.free_pages(table);
  n->page = -1;
  --stats_.pages;
  if (with_snapshot) {
    pool_.free_slot(n->snapshot);
    n->snapshot = -1;
    --stats_.snapshots;
    ++stats_.host_snapshots;
  }
  n->host = key;
  n->host_snapshot = with_snapshot;
  host_nodes_[key] = n;
  ++stats_.host_pages;
  ++stats_.offloaded_pages;
  return true;
}

// Drops `n`'s host entry (the node is leaving the host: back in the pool, or forgotten).
void PrefixCache::forget_host(Node* n) {
  DSV41RT_CHECK_CODE(kInternal, !n->resident() && n->host != 0,
                     "prefix cache: node is not on host");
  if (tier_->contains(n->host)) tier_->erase(n->host);  // a dropped entry is gone already
  host_nodes_.erase(n->host);
  --stats_.host_pages;
  if (n->host_snapshot) --stats_.host_snapshots;
  n->host = 0;
  n->host_snapshot = false;
}

// Brings `n` (on host, its parent resident) back into a pool page, evicting other unreferenced
// cached pages if none is free; its snapshot too when `want_snapshot` (evicting another snapshot
// if no slot is free) or a slot is free. False, changing nothing, when no page can be had.
bool PrefixCache::restore(Node* n, bool want_snapshot) {
  std::vector<int32_t> table;
  while (!pool_.ensure_pages(table, page_tokens_)) {
    if (!evict_page()) return false;  // never a pinned node: the path being restored
  }
  const uint8_t* data = tier_->data(n->host);
  copy_->page_from_host(data, table[0]);
  int32_t slot = -1;
  if (n->host_snapshot) {
    if (pool_.free_slot_count() < 1 && want_snapshot) evict_snapshot();
    slot = pool_.alloc_slot();
    if (slot >= 0) {
      copy_->slot_from_host(data + copy_->page_bytes(), slot);
    } else {
      ++stats_.evicted_snapshots;  // no slot to put it in: it is lost with the host entry
    }
  }
  forget_host(n);
  n->page = table[0];
  ++stats_.pages;
  ++stats_.restored_pages;
  if (slot >= 0) {
    n->snapshot = slot;
    ++stats_.snapshots;
  }
  return true;
}

// Brings the nodes of `path` (a lookup's matched blocks) back from the host, in order, up to the
// deepest one with a snapshot; stops at the first that cannot be brought back.
void PrefixCache::restore_path(const std::vector<Node*>& path) {
  size_t best = path.size();
  for (size_t k = 0; k < path.size(); ++k) {
    if (path[k]->snapshot >= 0 || path[k]->host_snapshot) best = k;
  }
  if (best == path.size()) return;
  for (size_t k = 0; k <= best; ++k) path[k]->pinned = true;
  for (size_t k = 0; k <= best; ++k) {
    if (!path[k]->resident() && !restore(path[k], k == best)) break;
  }
  for (size_t k = 0; k <= best; ++k) path[k]->pinned = false;
}

void PrefixCache::check_host(const Node& n) const {
  DSV41RT_CHECK_CODE(kInternal,
                     tier_ && n.host != 0 && n.snapshot < 0 && tier_->contains(n.host) &&
                         host_nodes_.count(n.host) && host_nodes_.at(n.host) == &n,
                     "prefix cache: node on host without its host entry (key ", n.host, ")");
  const int64_t bytes =
      copy_->page_bytes() + (n.host_snapshot ? copy_->slot_state_bytes() : 0);
  DSV41RT_CHECK_CODE(kInternal, tier_->bytes(n.host) == bytes, "prefix cache: host entry ",
                     n.host, " holds ", tier_->bytes(n.host), " bytes, expected ", bytes);
}

}  // namespace dsv41rt::engine
