#include "runtime/model/state_layout.h"

#include <numeric>

#include "core/status.h"

namespace dsv41rt::model {

StateLayout::StateLayout(const ModelPlan& plan, RowCodec window, RowCodec kv, RowCodec key,
                         int64_t page_tokens)
    : window_(window), kv_(kv), key_(key), page_tokens_(page_tokens) {
  const ModelConfig& c = plan.config;
  sliding_window_ = c.sliding_window;
  head_dim_ = c.head_dim;
  window_layer_bytes_ = sliding_window_ * window_.row_bytes;
  int64_t slot = window_layer_bytes_ * int64_t(plan.layers.size());
  int64_t page = 0;
  for (const LayerPlan& layer : plan.layers) {
    if (layer.role != LayerRole::kFull) continue;
    DSV41RT_CHECK(page_tokens % layer.ratio == 0, "page_tokens ", page_tokens,
                  " is not a multiple of compression ratio ", layer.ratio, " (layer ", layer.index,
                  "): a page boundary would split a compression group");
    Source s;
    s.layer = layer.index;
    s.ratio = layer.ratio;
    s.page_offset = page;
    page += (page_tokens / layer.ratio) * (kv_.row_bytes + key_.row_bytes);
    if (layer.ratio > 1) {
      s.pending_offset = slot;
      slot += 2 * (layer.ratio - 1) * head_dim_ * int64_t(sizeof(float));
    }
    sources_.push_back(s);
  }
  history_len_ = c.engram ? c.engram->max_ngram_size - 1 : 0;
  history_offset_ = slot;
  slot += history_len_ * int64_t(sizeof(int32_t));
  page_bytes_ = std::max<int64_t>(page, 1);
  slot_bytes_ = slot;
}

model::PoolGeometry StateLayout::geometry() const {
  return model::PoolGeometry{page_tokens_, page_bytes_, slot_bytes_};
}

uint8_t* StateLayout::window_row(const RequestView& r, int layer, int64_t position) const {
  return r.slot + layer * window_layer_bytes_ + (position % sliding_window_) * window_.row_bytes;
}

const StateLayout::Source& StateLayout::source(int layer) const {
  for (const Source& s : sources_) {
    if (s.layer == layer) return s;
  }
  DSV41RT_THROW_CODE(kInternal, "layer ", layer, " is not a KV source");
}

float* StateLayout::pending_values(const RequestView& r, int source_layer) const {
  const Source& s = source(source_layer);
  return reinterpret_cast<float*>(r.slot + s.pending_offset);
}

float* StateLayout::pending_scores(const RequestView& r, int source_layer) const {
  const Source& s = source(source_layer);
  return reinterpret_cast<float*>(r.slot + s.pending_offset) + (s.ratio - 1) * head_dim_;
}

int32_t* StateLayout::engram_history(const RequestView& r) const {
  return reinterpret_cast<int32_t*>(r.slot + history_offset_);
}

uint8_t* StateLayout::entry_row(model::KvPool& pool, const RequestView& r, int source_layer,
                                int64_t entry, bool key) const {
  const Source& s = source(source_layer);
  const int64_t per_page = page_tokens_ / s.ratio;
  const int64_t page = entry / per_page, row = entry % per_page;
  DSV41RT_CHECK_CODE(kInternal, page < r.n_pages, "compressed entry ", entry, " of layer ",
                     source_layer, " needs page ", page, " but the request has ", r.n_pages);
  uint8_t* base = pool.page_data(r.pages[page]) + s.page_offset;
  return key ? base + per_page * kv_.row_bytes + row * key_.row_bytes : base + row * kv_.row_bytes;
}

uint8_t* StateLayout::kv_row(model::KvPool& pool, const RequestView& r, int source_layer,
                             int64_t entry) const {
  return entry_row(pool, r, source_layer, entry, false);
}

uint8_t* StateLayout::key_row(model::KvPool& pool, const RequestView& r, int source_layer,
                              int64_t entry) const {
  return entry_row(pool, r, source_layer, entry, true);
}

int64_t StateLayout::entry_offset(int source_layer, bool key) const {
  const Source& s = source(source_layer);
  return s.page_offset + (key ? (page_tokens_ / s.ratio) * kv_.row_bytes : 0);
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

}  // namespace dsv41rt::model
