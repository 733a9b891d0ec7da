#include "runtime/model/cache_bytes.h"

#include "core/status.h"
#include "kernels/quant.h"
#include "kernels/v4_compressor.h"

namespace dsv41rt::model {
namespace {

constexpr int64_t kF32 = 4;

// V4's window / compressed row: nope FP8 + one UE8M0 scale per 64 (padded to 8 B) + rope BF16.
int64_t v4_row_bytes(int64_t head_dim, int64_t rope_dim) {
  const int64_t nope = head_dim - rope_dim;
  const int64_t scales = (nope + 63) / 64;
  return nope + (scales + 7) / 8 * 8 + 2 * rope_dim;
}

// One V4 compressor's flat FP32 state (kernels/v4_compressor.h: pending rows, A-halves).
int64_t v4_state_bytes(int64_t D, int64_t ratio, bool overlap) {
  kernels::V4CompressorWeights w;
  w.H = 1;
  w.D = D;
  w.ratio = ratio;
  w.overlap = overlap;
  return kernels::v4_compressor_state_floats(w) * kF32;
}

}  // namespace

CacheFormats CacheFormats::of(bool cache_quant) {
  if (cache_quant) return {};
  return {kernels::RowFormat::kF32, kernels::RowFormat::kF32, kernels::RowFormat::kF32};
}

CacheFormats CacheFormats::of(const ModelConfig& c, bool cache_quant) {
  if (c.is_v41() || !cache_quant) return of(cache_quant);
  DSV41RT_CHECK_CODE(
      kUnsupported,
      c.head_dim == kernels::kV4RowDim && c.head_dim - c.qk_rope_head_dim == kernels::kV4RowNope,
      c.source, ": DeepSeek-V4's quantised cache rows (584 B: ", kernels::kV4RowNope,
      " FP8 channels + ", kernels::kV4RowDim - kernels::kV4RowNope, " BF16) hold head_dim ",
      kernels::kV4RowDim, " with qk_rope_head_dim ", kernels::kV4RowDim - kernels::kV4RowNope,
      " only; this config has head_dim ", c.head_dim, ", qk_rope_head_dim ", c.qk_rope_head_dim,
      " (use kv_cache_dtype float32)");
  return {kernels::RowFormat::kV4Row, kernels::RowFormat::kV4Row, kernels::RowFormat::kMxfp4};
}

CacheRowBytes cache_row_bytes(const ModelConfig& c, const CacheFormats& f) {
  const int64_t index_key = kernels::row_bytes(f.key, c.index_head_dim);
  if (!c.is_v41()) {
    // With cache_quant off (FP32 caches) V4 keeps FP32 rows like V4.1; else its 584-byte rows.
    if (f.window == kernels::RowFormat::kF32 || f.window == kernels::RowFormat::kV4Row) {
      const int64_t row = kernels::row_bytes(f.window, c.head_dim);
      return {row, row, index_key};
    }
    const int64_t row = v4_row_bytes(c.head_dim, c.qk_rope_head_dim);
    return {row, row, index_key};
  }
  return {kernels::row_bytes(f.window, c.head_dim), kernels::row_bytes(f.kv, c.head_dim),
          index_key};
}

int64_t pending_compressor_bytes(const ModelConfig& c, const LayerPlan& layer) {
  const int64_t d = c.head_dim, m = layer.ratio;
  switch (layer.role) {
    case LayerRole::kFull:
      return (m - 1) * 2 * d * kF32;
    case LayerRole::kHca:
      return v4_state_bytes(d, m, false);
    case LayerRole::kCsa:  // the main compressor's state, then its indexer compressor's
      return v4_compressor_state_bytes(c, layer, false) + v4_compressor_state_bytes(c, layer, true);
    default:
      return 0;
  }
}

int64_t v4_compressor_state_bytes(const ModelConfig& c, const LayerPlan& layer, bool indexer) {
  switch (layer.role) {
    case LayerRole::kHca:
      return indexer ? 0 : v4_state_bytes(c.head_dim, layer.ratio, false);
    case LayerRole::kCsa:
      return v4_state_bytes(indexer ? c.index_head_dim : c.head_dim, layer.ratio, true);
    default:
      return 0;
  }
}

CacheBytes cache_bytes(const ModelPlan& plan) {
  const ModelConfig& c = plan.config;
  const CacheRowBytes rows = cache_row_bytes(c);
  CacheBytes out;
  out.window_row = rows.window;
  out.window_layers = int64_t(plan.layers.size() + plan.draft_layers.size());
  out.window_per_request = c.sliding_window * out.window_row * out.window_layers;
  for (const LayerPlan& layer : plan.layers) {
    // V4.1 Full and V4 CSA layers keep compressed KV + index keys, V4 HCA compressed KV only.
    int64_t per_entry = 0;
    if (layer.role == LayerRole::kFull || layer.role == LayerRole::kCsa) {
      per_entry = rows.compressed_kv + rows.index_key;
    } else if (layer.role == LayerRole::kHca) {
      per_entry = rows.compressed_kv;
    }
    if (per_entry > 0) out.global_per_token += double(per_entry) / layer.ratio;
    out.compressor_state_per_request += pending_compressor_bytes(c, layer);
  }
  out.engram_history_per_request = c.engram ? int64_t(c.engram->max_ngram_size - 1) * 4 : 0;
  return out;
}

}  // namespace dsv41rt::model
