// The prefix cache's host tier (see prefix_cache.h, host_tier.h): moving a node's page and
// snapshot to host memory when the device pool evicts them, and back when a lookup reaches them.
//
// A node's host entry (key Node::host) is either its page followed by its snapshot if it had one
// (the node is on host: page == -1), or its snapshot alone (the page is resident, the snapshot
// slot was evicted).
#include <cstring>
#include <vector>

#include "core/status.h"
#include "runtime/engine/prefix_cache.h"
#include "runtime/engine/prefix_cache_node.h"

namespace dsv41rt::engine {

// A new host entry of `bytes` for `n`, making room by dropping the least recently used entries of
// other nodes that no lookup is bringing back (each with its subtree: all on host, or resident
// with only a snapshot on host). Null when it cannot fit.
uint8_t* PrefixCache::put_entry(Node* n, int64_t bytes, uint64_t& key) {
  key = ++next_host_key_;
  std::vector<uint64_t> dropped;
  uint8_t* data = tier_->put(
      key, bytes,
      [this, n](uint64_t k) {
        const Node* owner = host_nodes_.at(k);
        return owner != n && !owner->pinned;
      },
      dropped);
  if (!data) return nullptr;
  for (uint64_t k : dropped) {
    auto it = host_nodes_.find(k);
    if (it == host_nodes_.end()) continue;  // went with an ancestor's subtree already
    Node* d = it->second;
    if (d->resident()) {
      forget_host(d);  // only its snapshot was on the host: the node itself stays
    } else {
      erase_subtree(d);
    }
  }
  return data;
}

// Copies `n`'s page (and snapshot, from its slot or its snapshot-only entry) into a new host
// entry and gives the page and slot back to the pool. False, changing nothing, when the entry
// cannot fit (the caller then forgets the node).
bool PrefixCache::offload(Node* n) {
  const bool with_snapshot = n->snapshot >= 0 || n->host_snapshot;
  const int64_t page_bytes = copy_->page_bytes();
  const int64_t bytes = page_bytes + (with_snapshot ? copy_->slot_state_bytes() : 0);
  uint64_t key = 0;
  uint8_t* data = put_entry(n, bytes, key);
  if (!data) return false;
  copy_->page_to_host(n->page, data);
  if (n->snapshot >= 0) {
    copy_->slot_to_host(n->snapshot, data + page_bytes);
    pool_.free_slot(n->snapshot);
    n->snapshot = -1;
    --stats_.snapshots;
  } else if (n->host_snapshot) {
    std::memcpy(data + page_bytes, tier_->data(n->host), size_t(copy_->slot_state_bytes()));
    forget_host(n);
  }
  std::vector<int32_t> table{n->page};
  pool_.free_pages(table);
  n->page = -1;
  --stats_.pages;
  n->host = key;
  n->host_snapshot = with_snapshot;
  host_nodes_[key] = n;
  ++stats_.host_pages;
  if (with_snapshot) ++stats_.host_snapshots;
  ++stats_.offloaded_pages;
  return true;
}

// Copies the snapshot of resident `n` into a snapshot-only host entry (the caller frees the
// slot either way). False when it cannot fit.
bool PrefixCache::offload_snapshot(Node* n) {
  uint64_t key = 0;
  uint8_t* data = put_entry(n, copy_->slot_state_bytes(), key);
  if (!data) return false;
  copy_->slot_to_host(n->snapshot, data);
  n->host = key;
  n->host_snapshot = true;
  host_nodes_[key] = n;
  ++stats_.host_snapshots;
  ++stats_.offloaded_snapshots;
  return true;
}

// Drops `n`'s host entry (what it held is back in the pool, or forgotten).
void PrefixCache::forget_host(Node* n) {
  DSV41RT_CHECK_CODE(kInternal, n->host != 0, "prefix cache: node has no host entry");
  if (tier_->contains(n->host)) tier_->erase(n->host);  // a dropped entry is gone already
  host_nodes_.erase(n->host);
  if (!n->resident()) --stats_.host_pages;
  if (n->host_snapshot) --stats_.host_snapshots;
  n->host = 0;
  n->host_snapshot = false;
}

// A slot for a snapshot coming back: a free one, or (when `evict`) another snapshot's.
int32_t PrefixCache::slot_for_restore(bool evict) {
  if (pool_.free_slot_count() < 1 && evict) evict_snapshot();  // never a pinned node's
  return pool_.alloc_slot();
}

// Brings `n` (on host, its parent resident) back into a pool page, evicting other unreferenced
// cached pages if none is free. Its snapshot comes back into a slot when `want_snapshot` (taking
// another snapshot's slot if none is free) or a slot is free; otherwise it stays on the host in a
// snapshot-only entry, if that fits. False, changing nothing, when no page can be had.
bool PrefixCache::restore(Node* n, bool want_snapshot) {
  std::vector<int32_t> table;
  while (!pool_.ensure_pages(table, page_tokens_)) {
    if (!evict_page()) return false;  // never a pinned node: the path being restored
  }
  const uint8_t* data = tier_->data(n->host);
  copy_->page_from_host(data, table[0]);
  const bool had_snapshot = n->host_snapshot;
  const int32_t slot = had_snapshot ? slot_for_restore(want_snapshot) : -1;
  if (slot >= 0) copy_->slot_from_host(data + copy_->page_bytes(), slot);
  // The entry goes; a snapshot without a slot moves to an entry of its own first.
  std::vector<uint8_t> kept;
  if (had_snapshot && slot < 0) {
    kept.assign(data + copy_->page_bytes(), data + copy_->page_bytes() + copy_->slot_state_bytes());
  }
  forget_host(n);
  n->page = table[0];
  ++stats_.pages;
  ++stats_.restored_pages;
  if (slot >= 0) {
    n->snapshot = slot;
    ++stats_.snapshots;
    ++stats_.restored_snapshots;
  } else if (had_snapshot) {
    uint64_t key = 0;
    uint8_t* entry = put_entry(n, int64_t(kept.size()), key);
    if (entry) {
      std::memcpy(entry, kept.data(), kept.size());
      n->host = key;
      n->host_snapshot = true;
      host_nodes_[key] = n;
      ++stats_.host_snapshots;
    } else {
      ++stats_.evicted_snapshots;  // lost: no slot and no host room
    }
  }
  return true;
}

// Brings the snapshot-only host entry of resident `n` back into a slot. False when no slot.
bool PrefixCache::restore_snapshot(Node* n) {
  const int32_t slot = slot_for_restore(/*evict=*/true);
  if (slot < 0) return false;
  copy_->slot_from_host(tier_->data(n->host), slot);
  forget_host(n);
  n->snapshot = slot;
  ++stats_.snapshots;
  ++stats_.restored_snapshots;
  return true;
}

// Brings the nodes of `path` (a lookup's matched blocks, ending at a snapshot in a slot or on the
// host) back from the host, in order, and the last one's snapshot; stops at the first that cannot
// be brought back. Every node of the path is pinned meanwhile: nothing evicts or drops it.
void PrefixCache::restore_path(const std::vector<Node*>& path) {
  if (path.empty()) return;
  const size_t best = path.size() - 1;
  for (size_t k = 0; k <= best; ++k) path[k]->pinned = true;
  bool whole = true;
  for (size_t k = 0; k <= best && whole; ++k) {
    if (!path[k]->resident()) whole = restore(path[k], k == best);
  }
  Node* last = path[best];
  if (whole && last->snapshot < 0 && last->host_snapshot) restore_snapshot(last);
  for (size_t k = 0; k <= best; ++k) path[k]->pinned = false;
}

void PrefixCache::check_host(const Node& n) const {
  DSV41RT_CHECK_CODE(kInternal,
                     tier_ && n.host != 0 && n.snapshot < 0 && tier_->contains(n.host) &&
                         host_nodes_.count(n.host) && host_nodes_.at(n.host) == &n &&
                         (!n.resident() || n.host_snapshot),
                     "prefix cache: node with a malformed host entry (key ", n.host, ")");
  const int64_t bytes =
      (n.resident() ? 0 : copy_->page_bytes()) + (n.host_snapshot ? copy_->slot_state_bytes() : 0);
  DSV41RT_CHECK_CODE(kInternal, tier_->bytes(n.host) == bytes, "prefix cache: host entry ", n.host,
                     " holds ", tier_->bytes(n.host), " bytes, expected ", bytes);
}

}  // namespace dsv41rt::engine
