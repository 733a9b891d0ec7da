// Cache bytes per token and per request, in closed form (architecture spec §5.3, §5.4, §7.1).
//
// The one cache-byte accounting: the state layout of the paged pool (state_layout.h) sizes its
// rows and pending compressor state with it, and `dsv41rt inspect` prints cache_bytes() through
// the bindings.
//
// V4.1, stored quantised as the runtime keeps it:
//   window row     = head_dim FP8 + head_dim/32 UE8M0 scales            (512 + 16 = 528 B)
//   compressed KV  = head_dim/2 packed E2M1 + head_dim/16 E4M3 scales   (256 + 32 = 288 B)
//   index key      = index_head_dim/2 E2M1 + index_head_dim/32 UE8M0    (64 + 4 = 68 B)
// Global KV per token = sum over Full layers of (compressed + index key) / ratio (890 B for
// V4.1-Flash). V4: window and compressed rows share one layout: nope FP8 + one UE8M0 scale per 64
// (padded to 8 B) + rope tail BF16 (448 + 8 + 128 = 584 B); CSA index keys 68 B.
#pragma once

#include <cstdint>

#include "core/export.h"
#include "kernels/paged.h"
#include "runtime/model/layer_plan.h"

namespace dsv41rt::model {

/// The row formats of the three caches: V4.1's release formats (FP8 window, NVFP4 compressed KV,
/// MXFP4 index keys), or FP32 everywhere with cache_quant off.
struct DSV41RT_API CacheFormats {
  kernels::RowFormat window = kernels::RowFormat::kFp8Window;
  kernels::RowFormat kv = kernels::RowFormat::kNvfp4;
  kernels::RowFormat key = kernels::RowFormat::kMxfp4;
  /// V4.1's formats (also what a V4.1-only caller such as the drafter asks for).
  static CacheFormats of(bool cache_quant);
  /// The formats `c` runs with: V4.1's above; for V4 with cache_quant on its own (spec 5.4): the
  /// 584-byte kV4Row for window and compressed KV, kMxfp4 index keys. V4's row holds head_dim 512
  /// with a rope part of 64 only: other dims are kUnsupported naming them.
  static CacheFormats of(const ModelConfig& c, bool cache_quant);
};

/// Bytes of one row of each cache (one position of one layer or KV source).
struct CacheRowBytes {
  int64_t window = 0, compressed_kv = 0, index_key = 0;
};

/// V4: `formats` all FP32 (cache_quant off) gives FP32 rows, kV4Row its 584-byte rows, and the
/// default (the release formats, what `inspect` prints) V4's row size in closed form for any dims
/// (nope FP8 + scales per 64 padded to 8 B + rope BF16; 584 B at the release's 512 / 64).
DSV41RT_API CacheRowBytes cache_row_bytes(const ModelConfig& c, const CacheFormats& formats = {});

/// The compressor state `layer` keeps per request between compression groups (FP32): a V4.1
/// ratio-m source holds at most m-1 pending tokens (value and gate rows, head_dim each); a V4
/// layer the flat states of kernels/v4_compressor.h (HCA: its compressor; CSA: its compressor,
/// then its indexer's compressor); 0 for layers that own no compressor.
DSV41RT_API int64_t pending_compressor_bytes(const ModelConfig& c, const LayerPlan& layer);

/// One of a V4 layer's compressors' state: the main one (indexer = false) or the CSA indexer's
/// (0 for HCA and for every other role).
DSV41RT_API int64_t v4_compressor_state_bytes(const ModelConfig& c, const LayerPlan& layer,
                                              bool indexer);

struct DSV41RT_API CacheBytes {
  int64_t window_row = 0;          ///< one window-KV row (one position, one layer)
  int64_t window_layers = 0;       ///< layers (incl. draft stages) that keep a window ring
  int64_t window_per_request = 0;  ///< sliding_window * window_row * window_layers
  double global_per_token = 0.0;   ///< compressed KV + index keys, all sources, per token
  int64_t compressor_state_per_request = 0;  ///< pending compressor tokens
  int64_t engram_history_per_request = 0;    ///< last (max_ngram - 1) compressed ids, int32
};

/// The footprint of `plan` in the release's cache formats.
DSV41RT_API CacheBytes cache_bytes(const ModelPlan& plan);

}  // namespace dsv41rt::model
