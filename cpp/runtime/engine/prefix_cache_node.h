// The prefix cache's tree node (private to prefix_cache*.cc).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "runtime/engine/prefix_cache.h"

namespace dsv41rt::engine {

struct PrefixCache::Node {
  Node* parent = nullptr;
  std::vector<int32_t> key;  // the block's tokens (empty at the root)
  std::map<std::vector<int32_t>, std::unique_ptr<Node>> children;
  int32_t page = -1;      // the cache's reference (-1 at the root and while on host)
  int32_t snapshot = -1;  // slot holding the state at the end of this block, or -1
  uint64_t last_use = 0;
  uint64_t host = 0;           // host-tier key while on host (page == -1), else 0
  bool host_snapshot = false;  // the host entry holds the snapshot after the page
  bool pinned = false;         // on the path a lookup is bringing back: not evicted meanwhile

  bool resident() const { return page >= 0; }
  bool has_resident_child() const {
    for (const auto& [k, c] : children) {
      if (c->resident()) return true;
    }
    return false;
  }
};

}  // namespace dsv41rt::engine
