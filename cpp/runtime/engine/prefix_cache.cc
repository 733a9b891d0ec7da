// Prefix cache (see prefix_cache.h). Eviction scans the tree for its least recently used
// candidate: linear in the cached pages, which is small next to a forward over them. The host
// tier's side (offload, restore): prefix_cache_host.cc.
#include "runtime/engine/prefix_cache.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <utility>

#include "core/status.h"
#include "runtime/engine/prefix_cache_node.h"

namespace dsv41rt::engine {

PrefixCache::PrefixCache(model::KvPool& pool, int64_t host_bytes, model::HostStateCopy* copy)
    : pool_(pool),
      page_tokens_(pool.geometry().page_tokens),
      root_(std::make_unique<Node>()),
      copy_(copy) {
  DSV41RT_CHECK(host_bytes >= 0, "host-cache-memory must be >= 0 bytes, got ", host_bytes);
  if (host_bytes == 0) return;
  DSV41RT_CHECK(copy != nullptr, "prefix cache: the host tier needs a host copier");
  tier_ = std::make_unique<HostTier>(host_bytes,
                                     [copy](int64_t bytes) { return copy->alloc_host(bytes); });
}

PrefixCache::~PrefixCache() {
  try {
    reset();
  } catch (...) {  // destructors never throw; the pool is going away with the engine anyway
  }
}

PrefixCache::Node* PrefixCache::child(const Node& parent, const int32_t* block) const {
  auto it = parent.children.find(std::vector<int32_t>(block, block + page_tokens_));
  return it == parent.children.end() ? nullptr : it->second.get();
}

void PrefixCache::touch(Node& n) { n.last_use = ++clock_; }

PrefixHit PrefixCache::lookup(const std::vector<int32_t>& tokens, int64_t max_tokens) {
  PrefixHit hit;
  const int64_t limit = std::min<int64_t>(max_tokens, int64_t(tokens.size()));
  std::vector<Node*> path;
  Node* n = root_.get();
  for (int64_t end = page_tokens_; end <= limit; end += page_tokens_) {
    n = child(*n, tokens.data() + end - page_tokens_);
    if (!n) break;
    path.push_back(n);
  }
  // Nodes past the deepest snapshot (in a slot or on the host) cannot end a hit: left out, they
  // are neither brought back nor looked at again (bringing others back may drop them).
  size_t usable = 0;
  for (size_t k = 0; k < path.size(); ++k) {
    if (path[k]->snapshot >= 0 || path[k]->host_snapshot) usable = k + 1;
  }
  path.resize(usable);
  if (tier_) restore_path(path);  // brings nodes on host back where it can
  for (size_t k = 0; k < path.size() && path[k]->resident(); ++k) {
    if (path[k]->snapshot >= 0) {
      hit.tokens = int64_t(k + 1) * page_tokens_;
      hit.snapshot_slot = path[k]->snapshot;
    }
  }
  // The nodes up to the hit are used; deeper ones matched but are not (no snapshot past them).
  const size_t used = size_t(hit.tokens / page_tokens_);
  for (size_t k = 0; k < used; ++k) {
    touch(*path[k]);
    hit.pages.push_back(path[k]->page);
  }
  return hit;
}

void PrefixCache::record_query(int64_t queried, int64_t hit) {
  stats_.queries += queried;
  stats_.hits += hit;
}

bool PrefixCache::has_snapshot(const std::vector<int32_t>& tokens, int64_t boundary) const {
  DSV41RT_CHECK(boundary >= 0 && boundary % page_tokens_ == 0 && boundary <= int64_t(tokens.size()),
                "prefix cache: boundary ", boundary, " is not a page boundary within ",
                tokens.size(), " tokens");
  const Node* n = root_.get();
  for (int64_t end = page_tokens_; end <= boundary && n; end += page_tokens_) {
    n = child(*n, tokens.data() + end - page_tokens_);
  }
  return n && n != root_.get() && n->snapshot >= 0;
}

bool PrefixCache::insert(const std::vector<int32_t>& tokens, int64_t boundary,
                         std::vector<int32_t>& pages, int32_t snapshot_slot) {
  DSV41RT_CHECK(boundary > 0 && boundary % page_tokens_ == 0 && boundary <= int64_t(tokens.size()),
                "prefix cache: boundary ", boundary, " is not a positive page boundary within ",
                tokens.size(), " tokens");
  const int64_t blocks = boundary / page_tokens_;
  DSV41RT_CHECK(int64_t(pages.size()) >= blocks, "prefix cache: ", boundary, " positions need ",
                blocks, " pages, got ", pages.size());
  Node* n = root_.get();
  for (int64_t k = 0; k < blocks; ++k) {
    const int32_t* block = tokens.data() + k * page_tokens_;
    Node* next = child(*n, block);
    if (next && !next->resident()) {
      // On the host: the request computed the block itself, so its page takes the node back
      // (equal bytes) and the host copy goes; its parent is resident already (walked through).
      pool_.retain_pages({pages[size_t(k)]});
      forget_host(next);
      next->page = pages[size_t(k)];
      ++stats_.pages;
    }
    if (!next) {
      pool_.retain_pages({pages[size_t(k)]});  // throws, changing nothing, on a bad page
      auto node = std::make_unique<Node>();
      node->parent = n;
      node->key.assign(block, block + page_tokens_);
      node->page = pages[size_t(k)];
      next = node.get();
      n->children.emplace(node->key, std::move(node));
      ++stats_.pages;
    }
    if (next->page != pages[size_t(k)]) {
      // Another request published this block from its own page. Its bytes equal ours (a pure
      // function of the same prefix), so the table switches to the cached page and frees its
      // own: a request holding a node's page then holds every ancestor's too, which is what
      // lets eviction take leaves only.
      pool_.retain_pages({next->page});
      std::vector<int32_t> own{pages[size_t(k)]};
      pool_.free_pages(own);
      pages[size_t(k)] = next->page;
    }
    touch(*next);
    n = next;
  }
  if (snapshot_slot < 0 || n->snapshot >= 0) return false;
  if (n->host_snapshot) forget_host(n);  // the fresh snapshot replaces the one on the host
  n->snapshot = snapshot_slot;
  ++stats_.snapshots;
  return true;
}

void PrefixCache::drop_snapshot(const std::vector<int32_t>& tokens, int64_t boundary) {
  DSV41RT_CHECK(boundary > 0 && boundary % page_tokens_ == 0 && boundary <= int64_t(tokens.size()),
                "prefix cache: boundary ", boundary, " is not a positive page boundary within ",
                tokens.size(), " tokens");
  Node* n = root_.get();
  for (int64_t end = page_tokens_; end <= boundary && n; end += page_tokens_) {
    n = child(*n, tokens.data() + end - page_tokens_);
  }
  if (n && n->resident() && n->host_snapshot) forget_host(n);  // it went to the host meanwhile
  if (!n || n->snapshot < 0) return;
  pool_.free_slot(n->snapshot);
  n->snapshot = -1;
  --stats_.snapshots;
}

void PrefixCache::erase_subtree(Node* n) {
  DSV41RT_CHECK_CODE(kInternal, n != root_.get(), "prefix cache: erasing the root");
  // Leaves first. Only nodes without resident children are erased while resident, so the pages
  // freed here are never ones a request's deeper page depends on.
  while (!n->children.empty()) erase_subtree(n->children.begin()->second.get());
  if (n->host != 0) forget_host(n);
  if (n->resident()) {
    std::vector<int32_t> table{n->page};
    pool_.free_pages(table);
    --stats_.pages;
  }
  if (n->snapshot >= 0) {
    pool_.free_slot(n->snapshot);
    --stats_.snapshots;
  }
  Node* parent = n->parent;
  parent->children.erase(n->key);  // destroys n
}

bool PrefixCache::evict_page() {
  Node* victim = nullptr;
  std::function<void(Node&)> scan = [&](Node& n) {
    for (auto& [key, c] : n.children) scan(*c);
    // Only the cache holds the page of a node with one reference (requests hold whole
    // prefixes, so a held node's ancestors are held too); nodes with resident children wait for
    // them, so resident nodes stay a subtree holding the root.
    if (&n != root_.get() && n.resident() && !n.pinned && !n.has_resident_child() &&
        pool_.page_refs(n.page) == 1 && (!victim || n.last_use < victim->last_use)) {
      victim = &n;
    }
  };
  scan(*root_);
  if (!victim) return false;
  ++stats_.evicted_pages;
  if (tier_ && offload(victim)) return true;
  if (victim->snapshot >= 0) ++stats_.evicted_snapshots;
  erase_subtree(victim);
  return true;
}

bool PrefixCache::evict_snapshot(int32_t spare) {
  Node* victim = nullptr;
  std::function<void(Node&)> scan = [&](Node& n) {
    for (auto& [key, c] : n.children) scan(*c);
    if (n.snapshot >= 0 && n.snapshot != spare && !n.pinned &&
        (!victim || n.last_use < victim->last_use)) {
      victim = &n;
    }
  };
  scan(*root_);
  if (!victim) return false;
  if (tier_ && victim->host == 0) offload_snapshot(victim);  // kept on the host if it fits
  pool_.free_slot(victim->snapshot);
  victim->snapshot = -1;
  --stats_.snapshots;
  ++stats_.evicted_snapshots;
  return true;
}

void PrefixCache::release_snapshot(int32_t slot) {
  Node* holder = nullptr;
  std::function<void(Node&)> scan = [&](Node& n) {
    for (auto& [key, c] : n.children) scan(*c);
    if (slot >= 0 && n.snapshot == slot) holder = &n;
  };
  scan(*root_);
  DSV41RT_CHECK(holder != nullptr, "prefix cache: no snapshot in slot ", slot);
  holder->snapshot = -1;
  --stats_.snapshots;
}

void PrefixCache::reset() {
  while (!root_->children.empty()) erase_subtree(root_->children.begin()->second.get());
  if (tier_) tier_->clear();  // empty already: every node on host was forgotten above
}

PrefixCacheStats PrefixCache::stats() const {
  PrefixCacheStats s = stats_;
  s.host_bytes = tier_ ? tier_->used_bytes() : 0;
  // A request holding a node holds its ancestors, so every unreferenced node can be evicted.
  std::function<void(const Node&)> walk = [&](const Node& n) {
    for (const auto& [key, c] : n.children) {
      s.reclaimable_pages += c->resident() && pool_.page_refs(c->page) == 1 ? 1 : 0;
      walk(*c);
    }
  };
  walk(*root_);
  return s;
}

void PrefixCache::owners(std::vector<std::vector<int32_t>>& page_tables,
                         std::vector<int32_t>& slots) const {
  int64_t pages = 0, snapshots = 0, host = 0, host_snapshots_alone = 0;
  std::function<void(const Node&)> walk = [&](const Node& n) {
    for (const auto& [key, c] : n.children) {
      DSV41RT_CHECK_CODE(
          kInternal,
          c->parent == &n && c->key == key && int64_t(key.size()) == page_tokens_ && !c->pinned,
          "prefix cache: malformed node (page ", c->page, ")");
      if (!c->resident()) {
        check_host(*c);  // owns no device page and no slot
        ++host;
        walk(*c);
        continue;
      }
      DSV41RT_CHECK_CODE(kInternal, &n == root_.get() || n.resident(),
                         "prefix cache: resident page ", c->page, " under a node on host");
      if (c->host != 0) {
        check_host(*c);  // its snapshot alone is on the host
        ++host_snapshots_alone;
      }
      page_tables.push_back({c->page});
      ++pages;
      if (c->snapshot >= 0) {
        slots.push_back(c->snapshot);
        ++snapshots;
      }
      walk(*c);
    }
  };
  walk(*root_);
  DSV41RT_CHECK_CODE(kInternal, pages == stats_.pages && snapshots == stats_.snapshots,
                     "prefix cache: counts ", stats_.pages, " pages / ", stats_.snapshots,
                     " snapshots, the tree holds ", pages, " / ", snapshots);
  DSV41RT_CHECK_CODE(kInternal,
                     host == stats_.host_pages &&
                         int64_t(host_nodes_.size()) == host + host_snapshots_alone &&
                         (tier_ ? tier_->entries() : 0) == host + host_snapshots_alone,
                     "prefix cache: counts ", stats_.host_pages, " nodes on host, the tree holds ",
                     host, ", the host tier ", (tier_ ? tier_->entries() : 0));
}

}  // namespace dsv41rt::engine
