// Per-compression-ratio dequant workspaces with validity tracking (design: docs/architecture.md,
// "Per-ratio dequant workspaces").
//
// Sparse prefill attends compressed-KV entries as dense FP32/BF16 rows, but the store keeps them
// packed (NVFP4, 288 B per 512-wide entry). All layers of one ratio group read the same source's
// entries, so the first consumer after the producer dequantises them into the ratio's workspace
// and the following Reuse/Reindex layers reuse the rows. A workspace is valid for a consumer iff
// it holds (same source layer, same allocation generation, same forward id, same source write
// epoch) and covers at least the rows requested. Everything else forces a refill:
//   - the producer wrote new entries (note_source_write bumps the source's epoch),
//   - a consumer of another source uses the workspace (source changes),
//   - the workspace was reallocated (growth, or shrink_to_fit) — new generation,
//   - a new forward started (begin_forward).
// Reuse can be switched off for A/B checks; counters report dequantisations and reuse hits.
// Backend-agnostic: storage comes from an allocator callback (host memory on CPU, device memory
// on CUDA); the fill callback does the actual dequantisation.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>

#include "core/export.h"

namespace dsv41rt {

struct DequantCounters {
  int64_t dequant_calls = 0;     ///< refills (one per invalid acquire)
  int64_t reuse_hits = 0;        ///< acquires served from valid rows
  int64_t rows_dequantised = 0;  ///< rows written by refills
  int64_t reallocations = 0;     ///< storage (re)allocations
};

class DSV41RT_API DequantWorkspaces {
 public:
  /// Storage for `bytes` bytes (owned by the returned pointer's deleter).
  using Allocator = std::function<std::shared_ptr<void>(int64_t bytes)>;
  /// Writes `rows` dequantised rows into `dst`.
  using Fill = std::function<void(void* dst, int64_t rows)>;

  explicit DequantWorkspaces(Allocator allocator = host_allocator(), bool reuse = true);

  /// A new forward: every workspace becomes stale for the next consumer.
  void begin_forward();
  /// The producer (Full layer) `source_layer` appended or rewrote compressed entries.
  void note_source_write(int source_layer);
  /// The workspace of `ratio` holding the first `rows` entries of `source_layer`, each
  /// `row_bytes` wide; refilled through `fill` unless the validity record matches.
  void* acquire(int ratio, int source_layer, int64_t rows, int64_t row_bytes, const Fill& fill);
  /// Release storage beyond what the last acquire of `ratio` needed (a new generation).
  void shrink_to_fit(int ratio);

  void set_reuse(bool reuse) { reuse_ = reuse; }
  bool reuse() const { return reuse_; }
  const DequantCounters& counters() const { return counters_; }
  void reset_counters() { counters_ = {}; }
  /// Overwrites the counters (a CUDA graph capture records the acquires without running them;
  /// each replay then adds the captured forward's counts).
  void set_counters(const DequantCounters& c) { counters_ = c; }
  /// Changes whenever any workspace's storage is (re)allocated: addresses baked into a captured
  /// graph are valid while it is unchanged.
  uint64_t storage_generation() const { return next_generation_; }
  /// Bytes currently allocated over all ratios (counted in the KV pool budget).
  int64_t allocated_bytes() const;

  static Allocator host_allocator();

 private:
  struct Workspace {
    std::shared_ptr<void> storage;
    int64_t capacity = 0;  // bytes
    uint64_t generation = 0;
    // Validity record of the current contents.
    bool filled = false;
    int source_layer = -1;
    uint64_t filled_generation = 0;
    uint64_t forward_id = 0;
    uint64_t source_epoch = 0;
    int64_t rows = 0;
    int64_t row_bytes = 0;
    int64_t last_request_bytes = 0;
  };

  Allocator allocator_;
  bool reuse_;
  uint64_t forward_id_ = 0;
  uint64_t next_generation_ = 1;
  std::map<int, uint64_t> source_epoch_;
  std::map<int, Workspace> by_ratio_;
  DequantCounters counters_;
};

}  // namespace dsv41rt
