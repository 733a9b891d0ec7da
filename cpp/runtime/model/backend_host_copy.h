// HostStateCopy over a Backend (the prefix cache's host tier on any device): pages and slots move
// with the backend's host<->device copies on its main stream, synchronised before returning, into
// the backend's fastest host memory (CUDA: pinned); a slot's state also carries the executor's
// host-side Engram history of that slot.
//
// Thread-safety: none; engine thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "runtime/model/backend.h"
#include "runtime/model/host_state_copy.h"
#include "runtime/model/kv_pool.h"

namespace dsv41rt::model {

class BackendHostCopy final : public HostStateCopy {
 public:
  /// `history(slot)`: the slot's `history_len` Engram ids kept on the host by the executor.
  BackendHostCopy(Backend& backend, KvPool& pool, int64_t history_len,
                  std::function<int32_t*(int32_t slot)> history);

  int64_t page_bytes() const override;
  int64_t slot_state_bytes() const override;
  std::shared_ptr<uint8_t> alloc_host(int64_t bytes) override;
  void page_to_host(int32_t page, uint8_t* dst) override;
  void page_from_host(const uint8_t* src, int32_t page) override;
  void slot_to_host(int32_t slot, uint8_t* dst) override;
  void slot_from_host(const uint8_t* src, int32_t slot) override;

 private:
  Backend& backend_;
  KvPool& pool_;
  int64_t history_len_;
  std::function<int32_t*(int32_t)> history_;
};

}  // namespace dsv41rt::model
