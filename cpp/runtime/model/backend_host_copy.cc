// The host tier's copies over a Backend (see backend_host_copy.h).
#include "runtime/model/backend_host_copy.h"

#include <cstring>
#include <utility>

namespace dsv41rt::model {

BackendHostCopy::BackendHostCopy(Backend& backend, KvPool& pool, int64_t history_len,
                                 std::function<int32_t*(int32_t slot)> history)
    : backend_(backend), pool_(pool), history_len_(history_len), history_(std::move(history)) {}

int64_t BackendHostCopy::page_bytes() const { return pool_.geometry().page_bytes; }

int64_t BackendHostCopy::slot_state_bytes() const {
  return pool_.geometry().slot_bytes + history_len_ * int64_t(sizeof(int32_t));
}

std::shared_ptr<uint8_t> BackendHostCopy::alloc_host(int64_t bytes) {
  return std::static_pointer_cast<uint8_t>(backend_.alloc_host(bytes));
}

void BackendHostCopy::page_to_host(int32_t page, uint8_t* dst) {
  backend_.activate();
  const Stream s = backend_.stream(0);
  backend_.to_host(dst, pool_.page_data(page), page_bytes(), s);
  backend_.synchronize(s);
}

void BackendHostCopy::page_from_host(const uint8_t* src, int32_t page) {
  backend_.activate();
  const Stream s = backend_.stream(0);
  backend_.to_device(pool_.page_data(page), src, page_bytes(), s);
  backend_.synchronize(s);  // the host entry is freed right after
}

void BackendHostCopy::slot_to_host(int32_t slot, uint8_t* dst) {
  backend_.activate();
  const Stream s = backend_.stream(0);
  const int64_t slot_bytes = pool_.geometry().slot_bytes;
  backend_.to_host(dst, pool_.slot_data(slot), slot_bytes, s);
  std::memcpy(dst + slot_bytes, history_(slot), size_t(history_len_) * sizeof(int32_t));
  backend_.synchronize(s);
}

void BackendHostCopy::slot_from_host(const uint8_t* src, int32_t slot) {
  backend_.activate();
  const Stream s = backend_.stream(0);
  const int64_t slot_bytes = pool_.geometry().slot_bytes;
  backend_.to_device(pool_.slot_data(slot), src, slot_bytes, s);
  std::memcpy(history_(slot), src + slot_bytes, size_t(history_len_) * sizeof(int32_t));
  backend_.synchronize(s);
}

}  // namespace dsv41rt::model
