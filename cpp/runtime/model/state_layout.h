// Where each piece of per-request state lives in the paged pool (architecture spec §7.1):
//
//   request slot (fixed size, one per running request):
//     [window rings: layer-major, sliding_window rows of the window codec each]
//     [pending compressor tokens of each ratio>=2 KV source: (ratio-1) value rows, (ratio-1) gate
//      rows, FP32 head_dim each]
//     [Engram history: (max_ngram - 1) int32 token ids, oldest first]
//   token page (page_tokens consecutive positions of one request):
//     for each KV source in layer order: page_tokens/ratio compressed-KV rows, then as many
//     index-key rows (the codecs' row formats: packed NVFP4 / MXFP4, or FP32 with cache_quant off).
//
// Counts that follow from the request length L are not stored: source entries = L div ratio,
// pending tokens = L mod ratio, valid window rows = min(L, W), history = the last min(L, n-1) ids.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/model/kv_pool.h"
#include "core/export.h"
#include "runtime/model/layer_plan.h"

namespace dsv41rt::model {

/// Storage format of one cache kind: packed release format, or raw FP32 with cache_quant off.
struct RowCodec {
  int64_t dim = 0;
  int64_t row_bytes = 0;
  void (*pack)(const float*, int64_t, int64_t, uint8_t*) = nullptr;
  void (*unpack)(const uint8_t*, int64_t, int64_t, float*) = nullptr;
  void (*qdq)(const float*, int64_t, int64_t, float*) = nullptr;  // nullptr: identity
};

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
  StateLayout(const ModelPlan& plan, RowCodec window, RowCodec kv, RowCodec key,
              int64_t page_tokens);

  model::PoolGeometry geometry() const;
  int64_t page_tokens() const { return page_tokens_; }
  const RowCodec& window_codec() const { return window_; }
  const RowCodec& kv_codec() const { return kv_; }
  const RowCodec& key_codec() const { return key_; }

  uint8_t* window_row(const RequestView& r, int layer, int64_t position) const;
  float* pending_values(const RequestView& r, int source_layer) const;
  float* pending_scores(const RequestView& r, int source_layer) const;
  int32_t* engram_history(const RequestView& r) const;
  int64_t history_len() const { return history_len_; }
  /// Row of compressed entry `entry` of `source_layer` (a page must cover its group).
  uint8_t* kv_row(model::KvPool& pool, const RequestView& r, int source_layer,
                  int64_t entry) const;
  uint8_t* key_row(model::KvPool& pool, const RequestView& r, int source_layer,
                   int64_t entry) const;

  // Byte offsets for kernels that address rows from device metadata (the CUDA executor).
  /// Where `source_layer`'s compressed-KV rows (key = false) or index-key rows start in a page.
  int64_t entry_offset(int source_layer, bool key) const;
  int64_t entries_per_page(int source_layer) const;
  /// Where `source_layer`'s pending compressor rows start in a slot (ratio >= 2).
  int64_t pending_offset(int source_layer) const;
  /// Where `layer`'s window ring starts in a slot.
  int64_t window_offset(int layer) const { return layer * window_layer_bytes_; }
  int64_t sliding_window() const { return sliding_window_; }

 private:
  struct Source {
    int layer = -1, ratio = 0;
    int64_t page_offset = 0;      // where this source's rows start in a page
    int64_t pending_offset = -1;  // in the slot (ratio >= 2)
  };
  const Source& source(int layer) const;
  uint8_t* entry_row(model::KvPool& pool, const RequestView& r, int source_layer, int64_t entry,
                     bool key) const;

  RowCodec window_, kv_, key_;
  int64_t page_tokens_ = 0, page_bytes_ = 0, slot_bytes_ = 0;
  int64_t window_layer_bytes_ = 0, sliding_window_ = 0, head_dim_ = 0;
  int64_t history_offset_ = 0, history_len_ = 0;
  std::vector<Source> sources_;
};

}  // namespace dsv41rt::model
