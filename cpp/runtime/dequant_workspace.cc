#include "runtime/dequant_workspace.h"

#include <cstdlib>

#include "core/status.h"

namespace dsv41rt {

DequantWorkspaces::DequantWorkspaces(Allocator allocator, bool reuse)
    : allocator_(std::move(allocator)), reuse_(reuse) {
  DSV41RT_CHECK(static_cast<bool>(allocator_), "DequantWorkspaces needs an allocator");
}

DequantWorkspaces::Allocator DequantWorkspaces::host_allocator() {
  return [](int64_t bytes) {
    void* p = std::malloc(static_cast<size_t>(bytes > 0 ? bytes : 1));
    DSV41RT_CHECK_CODE(kOutOfRange, p != nullptr, "dequant workspace: cannot allocate ", bytes,
                       " bytes");
    return std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  };
}

void DequantWorkspaces::begin_forward() { ++forward_id_; }

void DequantWorkspaces::note_source_write(int source_layer) { ++source_epoch_[source_layer]; }

void* DequantWorkspaces::acquire(int ratio, int source_layer, int64_t rows, int64_t row_bytes,
                                 const Fill& fill) {
  DSV41RT_CHECK(ratio >= 1 && source_layer >= 0 && rows >= 0 && row_bytes > 0,
                "dequant workspace: bad request ratio=", ratio, " source=", source_layer,
                " rows=", rows, " row_bytes=", row_bytes);
  Workspace& ws = by_ratio_[ratio];
  const int64_t bytes = rows * row_bytes;
  ws.last_request_bytes = bytes;
  if (bytes > ws.capacity || !ws.storage) {
    ws.storage = allocator_(bytes);
    ws.capacity = bytes;
    ws.generation = next_generation_++;
    ++counters_.reallocations;
  }
  const uint64_t epoch = source_epoch_[source_layer];
  const bool valid = reuse_ && ws.filled && ws.source_layer == source_layer &&
                     ws.filled_generation == ws.generation && ws.forward_id == forward_id_ &&
                     ws.source_epoch == epoch && ws.row_bytes == row_bytes && ws.rows >= rows;
  if (valid) {
    ++counters_.reuse_hits;
    return ws.storage.get();
  }
  fill(ws.storage.get(), rows);
  ws.filled = true;
  ws.source_layer = source_layer;
  ws.filled_generation = ws.generation;
  ws.forward_id = forward_id_;
  ws.source_epoch = epoch;
  ws.rows = rows;
  ws.row_bytes = row_bytes;
  ++counters_.dequant_calls;
  counters_.rows_dequantised += rows;
  return ws.storage.get();
}

void DequantWorkspaces::shrink_to_fit(int ratio) {
  auto it = by_ratio_.find(ratio);
  if (it == by_ratio_.end()) return;
  Workspace& ws = it->second;
  if (ws.last_request_bytes >= ws.capacity) return;
  ws.storage = allocator_(ws.last_request_bytes);
  ws.capacity = ws.last_request_bytes;
  ws.generation = next_generation_++;  // contents are gone: the next acquire refills
  ++counters_.reallocations;
}

int64_t DequantWorkspaces::allocated_bytes() const {
  int64_t total = 0;
  for (const auto& [ratio, ws] : by_ratio_) total += ws.storage ? ws.capacity : 0;
  return total;
}

}  // namespace dsv41rt
