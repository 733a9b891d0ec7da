// Copies of pool storage to and from host memory, for the prefix cache's host tier
// (engine/host_tier.h). The executor knows where a page or a slot lives (device memory on CUDA)
// and what else belongs to a slot's state beside the pool (the Engram history it keeps on the
// host), so it hands the cache one of these; PoolHostCopy is the plain-memcpy version for a pool
// in host memory whose slots are the whole state (the scheduler's unit tests).
//
// Thread-safety: none; engine thread.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>

#include "runtime/model/kv_pool.h"

namespace dsv41rt::model {

class HostStateCopy {
 public:
  virtual ~HostStateCopy() = default;
  /// Host bytes of one page / of one slot's whole state.
  virtual int64_t page_bytes() const = 0;
  virtual int64_t slot_state_bytes() const = 0;
  /// Host memory the copies are fastest from (CUDA: pinned); never null for bytes > 0.
  virtual std::shared_ptr<uint8_t> alloc_host(int64_t bytes) = 0;
  /// Each copy is complete when it returns (the device work is synchronised).
  virtual void page_to_host(int32_t page, uint8_t* dst) = 0;
  virtual void page_from_host(const uint8_t* src, int32_t page) = 0;
  virtual void slot_to_host(int32_t slot, uint8_t* dst) = 0;
  virtual void slot_from_host(const uint8_t* src, int32_t slot) = 0;
};

/// memcpy over a pool in host memory whose slot bytes are the whole slot state.
class PoolHostCopy final : public HostStateCopy {
 public:
  explicit PoolHostCopy(KvPool& pool) : pool_(pool) {}
  int64_t page_bytes() const override { return pool_.geometry().page_bytes; }
  int64_t slot_state_bytes() const override { return pool_.geometry().slot_bytes; }
  std::shared_ptr<uint8_t> alloc_host(int64_t bytes) override {
    return std::shared_ptr<uint8_t>(new uint8_t[size_t(bytes)], std::default_delete<uint8_t[]>());
  }
  void page_to_host(int32_t page, uint8_t* dst) override {
    std::memcpy(dst, pool_.page_data(page), size_t(page_bytes()));
  }
  void page_from_host(const uint8_t* src, int32_t page) override {
    std::memcpy(pool_.page_data(page), src, size_t(page_bytes()));
  }
  void slot_to_host(int32_t slot, uint8_t* dst) override {
    std::memcpy(dst, pool_.slot_data(slot), size_t(slot_state_bytes()));
  }
  void slot_from_host(const uint8_t* src, int32_t slot) override {
    std::memcpy(pool_.slot_data(slot), src, size_t(slot_state_bytes()));
  }

 private:
  KvPool& pool_;
};

}  // namespace dsv41rt::model
