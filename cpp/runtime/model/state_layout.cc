#include "runtime/model/state_layout.h"

#include <numeric>

#include "core/status.h"

namespace dsv41rt::model {

StateLayout::StateLayout(const ModelPlan& plan, CacheFormats formats, int64_t page_tokens)
    : formats_(formats), page_tokens_(page_tokens) {
  const ModelConfig& c = plan.config;
  sliding_window_ = c.sliding_window;
  const CacheRowBytes rows = cache_row_bytes(c, formats);
  window_row_bytes_ = rows.window;
  kv_row_bytes_ = rows.compressed_kv;
  key_row_bytes_ = rows.index_key;
  window_layer_bytes_ = sliding_window_ * window_row_bytes_;
  // V4's MTP layers keep a window ring each after the backbone's (window_offset(layers + s));
  // DSpark stages rebuild theirs from the target features and keep none.
  const int64_t rings = int64_t(plan.layers.size()) + (c.dspark ? 0 : c.num_nextn_predict_layers);
  int64_t slot = window_layer_bytes_ * rings;
  int64_t page = 0;
  for (const LayerPlan& layer : plan.layers) {
    // V4.1 Full layers and every V4 compressed layer (CSA, HCA: no sharing) own their entries.
    if (!layer.owns_compressor()) continue;
    DSV41RT_CHECK(page_tokens % layer.ratio == 0, "page_tokens ", page_tokens,
                  " is not a multiple of compression ratio ", layer.ratio, " (layer ", layer.index,
                  "): a page boundary would split a compression group");
    Source s;
    s.layer = layer.index;
    s.ratio = layer.ratio;
    s.keys = layer.owns_indexer();  // V4 HCA layers keep no index keys
    s.page_offset = page;
    page += (page_tokens / layer.ratio) * (kv_row_bytes_ + (s.keys ? key_row_bytes_ : 0));
    if (layer.ratio > 1) {
      s.pending_offset = slot;
      s.indexer_pending_offset = slot + v4_compressor_state_bytes(c, layer, false);
      slot += pending_compressor_bytes(c, layer);
    }
    sources_.push_back(s);
  }
  history_len_ = c.engram ? c.engram->max_ngram_size - 1 : 0;
  page_bytes_ = std::max<int64_t>(page, 1);
  slot_bytes_ = slot;
}

model::PoolGeometry StateLayout::geometry() const {
  return model::PoolGeometry{page_tokens_, page_bytes_, slot_bytes_};
}

const StateLayout::Source& StateLayout::source(int layer) const {
  for (const Source& s : sources_) {
    if (s.layer == layer) return s;
  }
  DSV41RT_THROW_CODE(kInternal, "layer ", layer, " is not a KV source");
}

int64_t StateLayout::entry_offset(int source_layer, bool key) const {
  const Source& s = source(source_layer);
  DSV41RT_CHECK_CODE(kInternal, !key || s.keys, "layer ", source_layer, " keeps no index keys");
  return s.page_offset + (key ? (page_tokens_ / s.ratio) * kv_row_bytes_ : 0);
}

int64_t StateLayout::entries_per_page(int source_layer) const {
  return page_tokens_ / source(source_layer).ratio;
}

int64_t StateLayout::pending_offset(int source_layer) const {
  const Source& s = source(source_layer);
  DSV41RT_CHECK_CODE(kInternal, s.pending_offset >= 0, "layer ", source_layer,
                     " (ratio 1) has no pending compressor rows");
  return s.pending_offset;
}

int64_t StateLayout::indexer_pending_offset(int source_layer) const {
  const Source& s = source(source_layer);
  DSV41RT_CHECK_CODE(kInternal,
                     s.keys && s.pending_offset >= 0 && s.indexer_pending_offset > s.pending_offset,
                     "layer ", source_layer, " has no indexer compressor state");
  return s.indexer_pending_offset;
}

}  // namespace dsv41rt::model
