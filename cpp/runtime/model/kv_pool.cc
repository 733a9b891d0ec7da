#include "runtime/model/kv_pool.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <new>

#include "core/status.h"

namespace dsv41rt::model {
namespace {

std::shared_ptr<uint8_t> host_allocate(int64_t bytes) {
  uint8_t* p = new (std::nothrow) uint8_t[static_cast<size_t>(bytes)];
  DSV41RT_CHECK_CODE(kOutOfRange, p != nullptr, "KV pool: cannot allocate ", bytes,
                     " bytes of host memory");
  return std::shared_ptr<uint8_t>(p, std::default_delete<uint8_t[]>());
}

// a * b, throwing instead of overflowing.
int64_t checked_mul(int64_t a, int64_t b, const char* what) {
  DSV41RT_CHECK_CODE(kOutOfRange, b == 0 || a <= std::numeric_limits<int64_t>::max() / b,
                     "KV pool: ", what, " overflows (", a, " x ", b, ")");
  return a * b;
}

std::shared_ptr<uint8_t> allocate(const KvPool::Allocator& allocator, int64_t bytes,
                                  const char* what) {
  if (bytes == 0) return nullptr;
  std::shared_ptr<uint8_t> p = allocator ? allocator(bytes) : host_allocate(bytes);
  DSV41RT_CHECK_CODE(kOutOfRange, p != nullptr, "KV pool: the allocator returned no storage for ",
                     what, " (", bytes, " bytes)");
  return p;
}

// Free stack holding 0..n-1 so that the lowest id is handed out first.
std::vector<int32_t> full_stack(int64_t n) {
  std::vector<int32_t> s(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) s[static_cast<size_t>(i)] = static_cast<int32_t>(n - 1 - i);
  return s;
}

}  // namespace

KvPool::KvPool(PoolGeometry geometry, int64_t num_pages, int64_t num_slots, Allocator allocator)
    : geometry_(geometry) {
  DSV41RT_CHECK(geometry.page_tokens >= 1, "KV pool: page_tokens must be >= 1, got ",
                geometry.page_tokens);
  DSV41RT_CHECK(geometry.page_bytes >= 0 && geometry.slot_bytes >= 0,
                "KV pool: negative page_bytes (", geometry.page_bytes, ") or slot_bytes (",
                geometry.slot_bytes, ")");
  DSV41RT_CHECK(num_pages >= 0 && num_slots >= 0, "KV pool: negative page count (", num_pages,
                ") or slot count (", num_slots, ")");
  constexpr int64_t kMaxIds = std::numeric_limits<int32_t>::max();
  DSV41RT_CHECK_CODE(kOutOfRange, num_pages <= kMaxIds && num_slots <= kMaxIds,
                     "KV pool: page/slot ids are int32; got ", num_pages, " pages, ", num_slots,
                     " slots");
  const int64_t page_total = checked_mul(num_pages, geometry.page_bytes, "page storage");
  const int64_t slot_total = checked_mul(num_slots, geometry.slot_bytes, "slot storage");
  pages_ = allocate(allocator, page_total, "token pages");
  slots_ = allocate(allocator, slot_total, "request slots");
  free_pages_ = full_stack(num_pages);
  free_slots_ = full_stack(num_slots);
  page_refs_.assign(static_cast<size_t>(num_pages), 0);
  slot_used_.assign(static_cast<size_t>(num_slots), 0);
}

KvPool KvPool::from_budget(PoolGeometry geometry, int64_t budget_bytes, int64_t max_slots,
                           Allocator allocator) {
  DSV41RT_CHECK(geometry.page_bytes >= 1 && geometry.slot_bytes >= 0,
                "KV pool: from_budget needs page_bytes >= 1 (got ", geometry.page_bytes,
                ") and slot_bytes >= 0 (got ", geometry.slot_bytes, ")");
  DSV41RT_CHECK(max_slots >= 1, "KV pool: max_slots must be >= 1, got ", max_slots);
  DSV41RT_CHECK(budget_bytes >= 0, "KV pool: negative memory budget ", budget_bytes);
  const int64_t minimum = geometry.slot_bytes + geometry.page_bytes;
  DSV41RT_CHECK_CODE(kOutOfRange, budget_bytes >= minimum, "KV pool: memory budget of ",
                     budget_bytes, " bytes is too small: one request slot (", geometry.slot_bytes,
                     " bytes) and one token page (", geometry.page_bytes, " bytes) need ", minimum,
                     " bytes");
  int64_t slots = max_slots;
  if (geometry.slot_bytes > 0) {
    // Keep room for at least one page.
    slots = std::min(slots, (budget_bytes - geometry.page_bytes) / geometry.slot_bytes);
  }
  const int64_t pages = (budget_bytes - slots * geometry.slot_bytes) / geometry.page_bytes;
  return KvPool(geometry, pages, slots, std::move(allocator));
}

int32_t KvPool::alloc_slot() {
  if (free_slots_.empty()) return -1;
  const int32_t s = free_slots_.back();
  free_slots_.pop_back();
  slot_used_[static_cast<size_t>(s)] = 1;
  return s;
}

void KvPool::free_slot(int32_t slot) {
  DSV41RT_CHECK(slot >= 0 && size_t(slot) < slot_used_.size(), "KV pool: slot ", slot,
                " out of range [0, ", slot_used_.size(), ")");
  DSV41RT_CHECK(slot_used_[static_cast<size_t>(slot)] != 0, "KV pool: slot ", slot,
                " is not allocated (double free?)");
  slot_used_[static_cast<size_t>(slot)] = 0;
  free_slots_.push_back(slot);
}

int64_t KvPool::pages_for(int64_t tokens) const {
  DSV41RT_CHECK(tokens >= 0, "KV pool: negative token count ", tokens);
  return (tokens + geometry_.page_tokens - 1) / geometry_.page_tokens;
}

bool KvPool::ensure_pages(std::vector<int32_t>& table, int64_t tokens) {
  const int64_t need = pages_for(tokens) - static_cast<int64_t>(table.size());
  if (need <= 0) return true;
  if (need > static_cast<int64_t>(free_pages_.size())) return false;
  table.reserve(table.size() + static_cast<size_t>(need));
  for (int64_t i = 0; i < need; ++i) {
    const int32_t p = free_pages_.back();
    free_pages_.pop_back();
    page_refs_[static_cast<size_t>(p)] = 1;
    table.push_back(p);
  }
  return true;
}

namespace {

// Throws unless every page of `table` is in range, allocated and listed once.
void check_table(const std::vector<int32_t>& table, const std::vector<int32_t>& refs,
                 const char* what) {
  std::vector<int32_t> sorted(table);
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) {
    const int32_t p = sorted[i];
    DSV41RT_CHECK(p >= 0 && size_t(p) < refs.size(), "KV pool: ", what, " of page ", p,
                  ", out of range [0, ", refs.size(), ")");
    DSV41RT_CHECK(i == 0 || sorted[i - 1] != p, "KV pool: page ", p,
                  " appears twice in one page table");
    DSV41RT_CHECK(refs[static_cast<size_t>(p)] != 0, "KV pool: ", what, " of page ", p,
                  ", which is not allocated (double free?)");
  }
}

}  // namespace

void KvPool::free_pages(std::vector<int32_t>& table) {
  // Validate everything first so a bad table leaves the pool untouched.
  check_table(table, page_refs_, "free");
  // Push in reverse so the table's first page is the next one handed out (LIFO).
  for (auto it = table.rbegin(); it != table.rend(); ++it) {
    if (--page_refs_[static_cast<size_t>(*it)] == 0) free_pages_.push_back(*it);
  }
  table.clear();
}

void KvPool::retain_pages(const std::vector<int32_t>& pages) {
  check_table(pages, page_refs_, "retain");
  for (int32_t p : pages) {
    int32_t& refs = page_refs_[static_cast<size_t>(p)];
    DSV41RT_CHECK_CODE(kOutOfRange, refs < std::numeric_limits<int32_t>::max(), "KV pool: page ", p,
                       " has too many references");
    ++refs;
  }
}

int32_t KvPool::page_refs(int32_t page) const {
  DSV41RT_CHECK_CODE(kOutOfRange, page >= 0 && size_t(page) < page_refs_.size(), "KV pool: page ",
                     page, " out of range [0, ", page_refs_.size(), ")");
  return page_refs_[static_cast<size_t>(page)];
}

uint8_t* KvPool::page_data(int32_t page) {
  return const_cast<uint8_t*>(static_cast<const KvPool*>(this)->page_data(page));
}

uint8_t* KvPool::slot_data(int32_t slot) {
  return const_cast<uint8_t*>(static_cast<const KvPool*>(this)->slot_data(slot));
}

const uint8_t* KvPool::page_data(int32_t page) const {
  DSV41RT_CHECK_CODE(kOutOfRange, page >= 0 && size_t(page) < page_refs_.size(), "KV pool: page ",
                     page, " out of range [0, ", page_refs_.size(), ")");
  return pages_.get() + static_cast<int64_t>(page) * geometry_.page_bytes;
}

const uint8_t* KvPool::slot_data(int32_t slot) const {
  DSV41RT_CHECK_CODE(kOutOfRange, slot >= 0 && size_t(slot) < slot_used_.size(), "KV pool: slot ",
                     slot, " out of range [0, ", slot_used_.size(), ")");
  return slots_.get() + static_cast<int64_t>(slot) * geometry_.slot_bytes;
}

int64_t KvPool::free_page_count() const { return static_cast<int64_t>(free_pages_.size()); }

int64_t KvPool::free_slot_count() const { return static_cast<int64_t>(free_slots_.size()); }

PoolUsage KvPool::usage() const {
  PoolUsage u;
  u.pages_total = static_cast<int64_t>(page_refs_.size());
  u.pages_used = u.pages_total - free_page_count();
  u.slots_total = static_cast<int64_t>(slot_used_.size());
  u.slots_used = u.slots_total - free_slot_count();
  u.bytes_total = u.pages_total * geometry_.page_bytes + u.slots_total * geometry_.slot_bytes;
  return u;
}

void KvPool::check_invariants(const std::vector<const std::vector<int32_t>*>& page_tables,
                              const std::vector<int32_t>& slots) const {
  // The free stacks against the used flags.
  auto check_stack = [](const std::vector<int32_t>& stack, const std::vector<uint8_t>& used,
                        const char* kind) {
    std::vector<uint8_t> seen(used.size(), 0);
    for (int32_t id : stack) {
      DSV41RT_CHECK_CODE(kInternal, id >= 0 && size_t(id) < used.size(), "KV pool: free ", kind,
                         " ", id, " out of range");
      DSV41RT_CHECK_CODE(kInternal, !seen[size_t(id)], "KV pool: ", kind, " ", id,
                         " is on the free list twice");
      DSV41RT_CHECK_CODE(kInternal, !used[size_t(id)], "KV pool: ", kind, " ", id,
                         " is on the free list but marked used");
      seen[size_t(id)] = 1;
    }
    int64_t used_count = 0;
    for (uint8_t u : used) used_count += u ? 1 : 0;
    DSV41RT_CHECK_CODE(kInternal, used_count + int64_t(stack.size()) == int64_t(used.size()),
                       "KV pool: ", used_count, " used + ", stack.size(), " free ", kind,
                       "s != ", used.size(), " total");
  };
  std::vector<uint8_t> page_used(page_refs_.size(), 0);
  for (size_t p = 0; p < page_refs_.size(); ++p) {
    DSV41RT_CHECK_CODE(kInternal, page_refs_[p] >= 0, "KV pool: page ", p,
                       " has a negative reference count");
    page_used[p] = page_refs_[p] > 0 ? 1 : 0;
  }
  check_stack(free_pages_, page_used, "page");
  check_stack(free_slots_, slot_used_, "slot");

  // Every table holding a page holds one of its references: holders == references.
  std::vector<int32_t> holders(page_refs_.size(), 0), first_holder(page_refs_.size(), -1);
  int64_t owned_pages = 0;  // distinct pages held by some table
  for (size_t t = 0; t < page_tables.size(); ++t) {
    DSV41RT_CHECK(page_tables[t] != nullptr, "KV pool: page table ", t, " is null");
    for (int32_t p : *page_tables[t]) {
      DSV41RT_CHECK_CODE(kInternal, p >= 0 && size_t(p) < page_refs_.size(), "KV pool: table ", t,
                         " holds page ", p, ", out of range [0, ", page_refs_.size(), ")");
      const size_t i = size_t(p);
      DSV41RT_CHECK_CODE(kInternal, page_refs_[i] != 0, "KV pool: table ", t, " holds page ", p,
                         ", which is not allocated");
      DSV41RT_CHECK_CODE(kInternal, first_holder[i] != int32_t(t), "KV pool: table ", t,
                         " lists page ", p, " twice");
      DSV41RT_CHECK_CODE(kInternal, holders[i] < page_refs_[i], "KV pool: page ", p,
                         " is owned twice (tables ", first_holder[i], " and ", t, ") but has ",
                         page_refs_[i], " reference(s)");
      if (holders[i]++ == 0) {
        first_holder[i] = static_cast<int32_t>(t);
        ++owned_pages;
      }
    }
  }
  std::vector<uint8_t> slot_owned(slot_used_.size(), 0);
  for (int32_t s : slots) {
    DSV41RT_CHECK_CODE(kInternal, s >= 0 && size_t(s) < slot_used_.size(), "KV pool: slot ", s,
                       " out of range [0, ", slot_used_.size(), ")");
    DSV41RT_CHECK_CODE(kInternal, slot_used_[size_t(s)] != 0, "KV pool: slot ", s,
                       " is listed as owned but not allocated");
    DSV41RT_CHECK_CODE(kInternal, !slot_owned[size_t(s)], "KV pool: slot ", s, " is owned twice");
    slot_owned[size_t(s)] = 1;
  }
  const PoolUsage u = usage();
  for (size_t p = 0; p < page_refs_.size(); ++p) {
    // A reference no table accounts for is a leak: the page can never be freed.
    DSV41RT_CHECK_CODE(kInternal, holders[p] == page_refs_[p], "KV pool: page ", p, " has ",
                       page_refs_[p], " reference(s) but ", holders[p], " table(s) hold it (leak)");
  }
  DSV41RT_CHECK_CODE(kInternal, u.pages_used == owned_pages, "KV pool: ", u.pages_used,
                     " pages used but the owners hold ", owned_pages);
  if (u.slots_used != static_cast<int64_t>(slots.size())) {
    int32_t leaked = -1;
    for (size_t s = 0; s < slot_used_.size() && leaked < 0; ++s) {
      if (slot_used_[s] && !slot_owned[s]) leaked = static_cast<int32_t>(s);
    }
    DSV41RT_THROW_CODE(kInternal, "KV pool: ", u.slots_used, " slots used but the owners hold ",
                       slots.size(), " (slot ", leaked, " is allocated and owned by no one: leak)");
  }
}

std::string KvPool::describe() const {
  const PoolUsage u = usage();
  char mib[32];
  std::snprintf(mib, sizeof(mib), "%.1f", static_cast<double>(u.bytes_total) / (1024.0 * 1024.0));
  return detail::str_cat("KV pool: ", u.pages_total, " pages x ", geometry_.page_tokens,
                         " tokens = ", u.pages_total * geometry_.page_tokens, " tokens, ",
                         u.slots_total, " request slots, ", mib, " MiB");
}

}  // namespace dsv41rt::model
