// Where each piece of per-request state lives in the paged pool (architecture spec §7.1):
//
//   request slot (fixed size, one per running request):
//     [window rings: layer-major, sliding_window rows of the window format each]
//     [pending compressor tokens of each ratio>=2 KV source: (ratio-1) value rows, (ratio-1) gate
//      rows, FP32 head_dim each (pending_compressor_bytes, cache_bytes.h); a V4 layer: the flat
//      state of kernels/v4_compressor.h, and a CSA layer's indexer compressor's state after it]
//   token page (page_tokens consecutive positions of one request):
//     for each KV source in layer order: page_tokens/ratio compressed-KV rows, then as many
//     index-key rows (packed NVFP4 / MXFP4, or FP32 with cache_quant off); a V4 HCA layer keeps
//     no index keys. V4 has no sharing: every CSA and HCA layer is a source.
// The Engram history (the last max_ngram - 1 token ids) is planning input only (the host hashes
// the n-grams), so the executor keeps it in host memory beside the slot.
//
// Counts that follow from the request length L are not stored: source entries = L div ratio,
// pending tokens = L mod ratio, valid window rows = min(L, W), history = the last min(L, n-1) ids.
#pragma once

#include <cstdint>
#include <vector>

#include "core/export.h"
#include "kernels/paged.h"
#include "runtime/model/cache_bytes.h"
#include "runtime/model/kv_pool.h"
#include "runtime/model/layer_plan.h"

namespace dsv41rt::model {

/// A request's state as the executor sees it: its slot, its page table, and its length (the
/// number of positions already in the state).
struct RequestView {
  uint8_t* slot = nullptr;
  const int32_t* pages = nullptr;
  int64_t n_pages = 0;
  int64_t length = 0;
};

class DSV41RT_API StateLayout {
 public:
  StateLayout(const ModelPlan& plan, CacheFormats formats, int64_t page_tokens);

  PoolGeometry geometry() const;
  int64_t page_tokens() const { return page_tokens_; }
  const CacheFormats& formats() const { return formats_; }
  int64_t window_row_bytes() const { return window_row_bytes_; }
  int64_t kv_row_bytes() const { return kv_row_bytes_; }
  int64_t key_row_bytes() const { return key_row_bytes_; }
  /// Engram history length (token ids kept per request; 0 without Engram).
  int64_t history_len() const { return history_len_; }

  // Byte offsets for the ops that address rows from metadata (kernels/paged.h).
  /// Where `source_layer`'s compressed-KV rows (key = false) or index-key rows start in a page.
  int64_t entry_offset(int source_layer, bool key) const;
  int64_t entries_per_page(int source_layer) const;
  /// Where `source_layer`'s pending compressor rows start in a slot (ratio >= 2).
  int64_t pending_offset(int source_layer) const;
  /// V4 CSA: where `source_layer`'s indexer compressor state starts in a slot (after the main
  /// compressor's, pending_offset).
  int64_t indexer_pending_offset(int source_layer) const;
  /// Where `layer`'s window ring starts in a slot.
  int64_t window_offset(int layer) const { return layer * window_layer_bytes_; }
  int64_t sliding_window() const { return sliding_window_; }

 private:
  struct Source {
    int layer = -1, ratio = 0;
    int64_t page_offset = 0;              // where this source's rows start in a page
    bool keys = true;                     // keeps index-key rows (not V4 HCA)
    int64_t pending_offset = -1;          // in the slot (ratio >= 2)
    int64_t indexer_pending_offset = -1;  // V4 CSA: the indexer compressor's state
  };
  const Source& source(int layer) const;

  CacheFormats formats_;
  int64_t window_row_bytes_ = 0, kv_row_bytes_ = 0, key_row_bytes_ = 0;
  int64_t page_tokens_ = 0, page_bytes_ = 0, slot_bytes_ = 0;
  int64_t window_layer_bytes_ = 0, sliding_window_ = 0, history_len_ = 0;
  std::vector<Source> sources_;
};

}  // namespace dsv41rt::model
