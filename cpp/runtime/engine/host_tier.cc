// Host tier of the prefix cache (see host_tier.h).
#include "runtime/engine/host_tier.h"

#include <utility>

#include "core/status.h"

namespace dsv41rt::engine {

HostTier::HostTier(int64_t budget_bytes, Allocator allocator)
    : budget_(budget_bytes), allocator_(std::move(allocator)) {
  DSV41RT_CHECK(budget_bytes > 0, "host cache tier: budget must be > 0 bytes, got ", budget_bytes);
  if (!allocator_) {
    allocator_ = [](int64_t bytes) {
      return std::shared_ptr<uint8_t>(new uint8_t[size_t(bytes)], std::default_delete<uint8_t[]>());
    };
  }
}

const HostTier::Entry& HostTier::entry(uint64_t key) const {
  auto it = entries_.find(key);
  DSV41RT_CHECK(it != entries_.end(), "host cache tier: no entry ", key);
  return it->second;
}

uint8_t* HostTier::put(uint64_t key, int64_t bytes, const std::function<bool(uint64_t)>& evictable,
                       std::vector<uint64_t>& dropped) {
  DSV41RT_CHECK(bytes > 0, "host cache tier: entry of ", bytes, " bytes");
  DSV41RT_CHECK(!contains(key), "host cache tier: entry ", key, " exists already");
  if (bytes > budget_) return nullptr;  // never fits: the caller drops what it wanted to keep
  // Decide the victims first, so that a failed put changes nothing.
  std::vector<uint64_t> victims;
  int64_t room = budget_ - used_;
  for (auto it = order_.begin(); room < bytes && it != order_.end(); ++it) {
    if (!evictable(*it)) continue;
    victims.push_back(*it);
    room += entries_.at(*it).bytes;
  }
  if (room < bytes) return nullptr;
  for (uint64_t v : victims) {
    erase(v);
    dropped.push_back(v);
  }
  Entry e;
  e.data = buffer(bytes);
  e.bytes = bytes;
  e.pos = order_.insert(order_.end(), key);
  uint8_t* data = e.data.get();
  entries_.emplace(key, std::move(e));
  used_ += bytes;
  return data;
}

// A kept buffer of that size, else a new one once kept buffers of other sizes have made room
// (put() checked that entries leave it).
std::shared_ptr<uint8_t> HostTier::buffer(int64_t bytes) {
  auto same = spare_.find(bytes);
  if (same != spare_.end() && !same->second.empty()) {
    std::shared_ptr<uint8_t> b = std::move(same->second.back());
    same->second.pop_back();
    spare_bytes_ -= bytes;
    return b;
  }
  auto over = [&] { return used_ + spare_bytes_ + bytes > budget_; };
  for (auto it = spare_.begin(); over() && it != spare_.end(); ++it) {
    while (!it->second.empty() && over()) {
      it->second.pop_back();
      spare_bytes_ -= it->first;
    }
  }
  return allocator_(bytes);
}

uint8_t* HostTier::data(uint64_t key) { return entry(key).data.get(); }

int64_t HostTier::bytes(uint64_t key) const { return entry(key).bytes; }

void HostTier::touch(uint64_t key) {
  auto it = entries_.find(key);
  DSV41RT_CHECK(it != entries_.end(), "host cache tier: no entry ", key);
  order_.splice(order_.end(), order_, it->second.pos);
}

void HostTier::erase(uint64_t key) {
  auto it = entries_.find(key);
  DSV41RT_CHECK(it != entries_.end(), "host cache tier: no entry ", key);
  used_ -= it->second.bytes;
  spare_[it->second.bytes].push_back(std::move(it->second.data));
  spare_bytes_ += it->second.bytes;
  order_.erase(it->second.pos);
  entries_.erase(it);
}

void HostTier::clear() {
  entries_.clear();
  order_.clear();
  spare_.clear();
  used_ = 0;
  spare_bytes_ = 0;
}

}  // namespace dsv41rt::engine
