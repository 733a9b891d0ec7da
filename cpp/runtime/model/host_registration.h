// Host memory the device reads in place, registered once per process (issue 20 item 3: the Engram
// tables live once per host). A checkpoint's Engram tables stay in its read-only file mapping;
// registering those pages (cudaHostRegister) lets the gathers read them over PCIe without a pinned
// copy per rank, and the page cache holds them once for every process of the host that maps the
// same file. Virtual ranks of one process ask for the same ranges again, and a table's scales may
// share a page with it or the next table: a page can be registered only once per process, so this
// registry registers only the pages no earlier registration holds and keeps each registered span
// alive while any weights use it (shared ownership; the last owner unregisters it).
//
// The registry is CUDA-free (the register / unregister calls are given), so its page bookkeeping
// is tested on the CPU (tests/cpp/test_host_registration.cc); cuda_weights.cc gives it the CUDA
// calls and falls back to a pinned copy when registration is not possible.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "core/export.h"

namespace dsv41rt::model {

class DSV41RT_API HostRegistry {
 public:
  /// Registers [base, base + bytes) (page-aligned); false when it cannot (nothing registered).
  using RegisterFn = std::function<bool(void* base, size_t bytes)>;
  using UnregisterFn = std::function<void(void* base)>;
  HostRegistry(size_t page_bytes, RegisterFn reg, UnregisterFn unreg);

  /// Makes [p, p + bytes) registered: the pages that no live span holds are registered as new
  /// spans. Returns owners of every span covering the range (hold them as long as the memory is
  /// read), or an empty vector when a registration failed (then nothing new stays registered).
  std::vector<std::shared_ptr<void>> cover(const void* p, size_t bytes);

  /// [p, p + bytes) cut at the edges of the live spans: {offset, length} pieces, each inside one
  /// span or outside every span. A host-to-device copy (cudaMemcpy) whose source straddles the
  /// edge of a registration fails with an invalid argument, and a file's other tensors share
  /// the registered pages' edges: uploads copy piece by piece.
  std::vector<std::pair<size_t, size_t>> pieces(const void* p, size_t bytes) const;

  /// Pages currently registered (live spans), for tests and accounting.
  size_t registered_pages() const;

 private:
  struct Span {
    uintptr_t end;
    std::weak_ptr<void> owner;
  };
  void drop_expired_locked();

  const size_t page_;
  const RegisterFn reg_;
  const UnregisterFn unreg_;
  mutable std::mutex mu_;
  std::map<uintptr_t, Span> spans_;  // begin -> span, disjoint, page-aligned
};

}  // namespace dsv41rt::model
