#include "runtime/model/host_registration.h"

#include <utility>

#include "core/status.h"

namespace dsv41rt::model {

HostRegistry::HostRegistry(size_t page_bytes, RegisterFn reg, UnregisterFn unreg)
    : page_(page_bytes), reg_(std::move(reg)), unreg_(std::move(unreg)) {
  DSV41RT_CHECK(page_ > 0 && (page_ & (page_ - 1)) == 0, "host registry: page size ", page_,
                " is not a power of two");
}

void HostRegistry::drop_expired_locked() {
  for (auto it = spans_.begin(); it != spans_.end();) {
    it = it->second.owner.expired() ? spans_.erase(it) : std::next(it);
  }
}

std::vector<std::shared_ptr<void>> HostRegistry::cover(const void* p, size_t bytes) {
  std::vector<std::shared_ptr<void>> owners;
  if (p == nullptr || bytes == 0) return owners;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p) & ~uintptr_t(page_ - 1);
  const uintptr_t end =
      (reinterpret_cast<uintptr_t>(p) + bytes + page_ - 1) & ~uintptr_t(page_ - 1);
  std::lock_guard<std::mutex> lock(mu_);
  drop_expired_locked();
  // Walk [begin, end): live spans that overlap it are reused, the gaps between them registered.
  std::vector<std::pair<uintptr_t, uintptr_t>> gaps;
  uintptr_t at = begin;
  auto it = spans_.upper_bound(begin);
  if (it != spans_.begin() && std::prev(it)->second.end > begin) --it;
  for (; it != spans_.end() && it->first < end; ++it) {
    if (it->first > at) gaps.emplace_back(at, it->first);
    owners.push_back(it->second.owner.lock());  // not expired: dropped above, under the lock
    at = std::max(at, it->second.end);
  }
  if (at < end) gaps.emplace_back(at, end);
  struct Fresh {
    uintptr_t begin, end;
    std::shared_ptr<void> owner;
  };
  std::vector<Fresh> fresh;
  for (const auto& [b, e] : gaps) {
    void* base = reinterpret_cast<void*>(b);
    // On a failure the spans this call registered go with `fresh` (their owners unregister them).
    if (!reg_(base, size_t(e - b))) return {};
    UnregisterFn unreg = unreg_;
    fresh.push_back({b, e, std::shared_ptr<void>(base, [unreg](void* q) { unreg(q); })});
  }
  for (Fresh& f : fresh) {
    spans_[f.begin] = Span{f.end, f.owner};
    owners.push_back(std::move(f.owner));
  }
  return owners;
}

std::vector<std::pair<size_t, size_t>> HostRegistry::pieces(const void* p, size_t bytes) const {
  std::vector<std::pair<size_t, size_t>> out;
  if (bytes == 0) return out;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p), end = begin + bytes;
  std::vector<uintptr_t> cuts;  // span edges strictly inside (begin, end), ascending
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = spans_.upper_bound(begin);
    if (it != spans_.begin() && std::prev(it)->second.end > begin) --it;
    for (; it != spans_.end() && it->first < end; ++it) {
      if (it->second.owner.expired()) continue;
      if (it->first > begin) cuts.push_back(it->first);
      if (it->second.end < end) cuts.push_back(it->second.end);
    }
  }
  uintptr_t at = begin;
  for (uintptr_t c : cuts) {
    if (c > at) out.emplace_back(size_t(at - begin), size_t(c - at)), at = c;
  }
  out.emplace_back(size_t(at - begin), size_t(end - at));
  return out;
}

size_t HostRegistry::registered_pages() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t pages = 0;
  for (const auto& [b, s] : spans_) {
    if (!s.owner.expired()) pages += (s.end - b) / page_;
  }
  return pages;
}

}  // namespace dsv41rt::model
