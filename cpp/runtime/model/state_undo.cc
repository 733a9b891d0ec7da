#include "runtime/model/state_undo.h"

#include <algorithm>

#include "core/status.h"
#include "runtime/model/cache_bytes.h"

namespace dsv41rt::model {

bool UndoRecord::can_restore(int64_t current, int64_t target) const {
  if (!recorded() || target < length || target > current || current > length + n) return false;
  // A forward longer than the ring overwrote ring rows of its own earlier positions: only the
  // state before it (or the one it left) is known.
  return n <= window || target == length || target == current;
}

std::vector<PendingSource> pending_sources(const ModelPlan& plan, const StateLayout& layout) {
  const ModelConfig& c = plan.config;
  std::vector<PendingSource> out;
  for (const LayerPlan& layer : plan.layers) {
    if (!layer.owns_compressor() || layer.ratio < 2) continue;
    PendingSource ps;
    ps.layer = layer.index;
    ps.ratio = layer.ratio;
    ps.offset = layout.pending_offset(layer.index);
    ps.D = ps.width = c.head_dim;
    if (layer.role == LayerRole::kFull) {
      ps.bytes = pending_compressor_bytes(c, layer);
      out.push_back(ps);
      continue;
    }
    // DeepSeek-V4: the layer's compressor, then (CSA) its indexer's, as the slot holds them.
    ps.v4 = true;
    ps.overlap = layer.role == LayerRole::kCsa;  // ratio 4, overlapping windows
    ps.width = ps.overlap ? 2 * ps.D : ps.D;
    ps.bytes = v4_compressor_state_bytes(c, layer, false);
    out.push_back(ps);
    if (layer.role != LayerRole::kCsa) continue;
    ps.indexer = true;
    ps.offset = layout.indexer_pending_offset(layer.index);
    ps.D = c.index_head_dim;
    ps.width = 2 * ps.D;
    ps.bytes = v4_compressor_state_bytes(c, layer, true);
    out.push_back(ps);
  }
  return out;
}

void finish_capture(const PendingSource& ps, int64_t length, int64_t n, const float* captured,
                    float* out) {
  const int64_t W = ps.width;
  std::copy(captured, captured + 2 * n * W, out);
  if (!ps.v4) return;
  // V4 captures s before v4_compress adds ape[t mod ratio]: the same one float add per element.
  const float* ape = captured + 2 * n * W;
  float* scores = out + n * W;
  for (int64_t r = 0; r < n; ++r) {
    const float* a = ape + ((length + r) % ps.ratio) * W;
    for (int64_t c = 0; c < W; ++c) scores[r * W + c] += a[c];
  }
}

void save_undo(Backend& be, const ModelPlan& plan, const StateLayout& layout, const uint8_t* slot,
               const int32_t* history, int64_t length, const int32_t* tokens, int64_t n,
               UndoRecord& rec) {
  DSV41RT_CHECK(slot && tokens && n > 0 && length >= 0, "save_undo: bad arguments");
  const int64_t W = layout.sliding_window(), k = std::min(n, W), RB = layout.window_row_bytes();
  const int64_t layers = int64_t(plan.layers.size()), hist = layout.history_len();
  const std::vector<PendingSource> sources = pending_sources(plan, layout);
  rec = UndoRecord{};
  rec.length = length;
  rec.n = n;
  rec.window = W;
  rec.tokens.assign(tokens, tokens + n);
  if (hist > 0) rec.history.assign(history, history + hist);
  rec.ring.resize(size_t(layers * k * RB));
  int64_t pending_bytes = 0, rows = 0;
  for (const PendingSource& ps : sources) {
    pending_bytes += ps.bytes;
    rows += 2 * n * ps.width;
  }
  rec.pending.resize(size_t(pending_bytes));
  rec.compressor_rows.resize(size_t(rows));

  const Stream s = be.stream(0);
  for (int64_t l = 0; l < layers; ++l) {
    const uint8_t* ring = slot + layout.window_offset(int(l));
    // Positions length .. length + k - 1 sit at ring indices (length + j) % W: at most two spans.
    for (int64_t j = 0; j < k;) {
      const int64_t index = (length + j) % W, span = std::min(k - j, W - index);
      be.to_host(rec.ring.data() + (l * k + j) * RB, ring + index * RB, span * RB, s);
      j += span;
    }
  }
  int64_t off = 0;
  for (const PendingSource& ps : sources) {
    be.to_host(rec.pending.data() + off, slot + ps.offset, ps.bytes, s);
    off += ps.bytes;
  }
  be.synchronize(s);
}

void restore_undo(Backend& be, const ModelPlan& plan, const StateLayout& layout, uint8_t* slot,
                  int32_t* history, const UndoRecord& rec, int64_t current, int64_t target) {
  DSV41RT_CHECK_CODE(kOutOfRange, rec.can_restore(current, target), "rollback to ", target,
                     " positions from ", current, ": the recorded forward ran ", rec.n,
                     " positions from ", rec.length,
                     rec.n > rec.window ? " (longer than the window ring: only all of them)" : "",
                     rec.recorded() ? "" : " (no forward recorded)");
  if (target == current) return;
  const int64_t L0 = rec.length, W = rec.window, k = std::min(rec.n, W);
  const int64_t RB = layout.window_row_bytes();
  const int64_t layers = int64_t(plan.layers.size());
  const Stream s = be.stream(0);
  // Ring rows of the dropped positions get back what they replaced. Under the rule every dropped
  // position p is < L0 + W, so its saved row is j = p - L0 < k.
  for (int64_t l = 0; l < layers; ++l) {
    uint8_t* ring = slot + layout.window_offset(int(l));
    for (int64_t p = target; p < std::min(current, target + W); ++p) {
      const int64_t j = p - L0;
      be.to_device(ring + (p % W) * RB, rec.ring.data() + (l * k + j) * RB, RB, s);
    }
  }
  // Pending rows: those before the forward, then the raw rows of the forward's positions in the
  // group `target` ends in (target - target % m .. target - 1 that are >= L0). V4's states are
  // rebuilt whole (state_undo_v4.cc).
  const std::vector<PendingSource> sources = pending_sources(plan, layout);
  int64_t off = 0, row_off = 0;
  for (const PendingSource& ps : sources) {
    const float* values = rec.compressor_rows.data() + row_off;
    const uint8_t* saved = rec.pending.data() + off;
    off += ps.bytes;
    row_off += 2 * rec.n * ps.width;
    if (ps.v4) {
      restore_v4_compressor(be, ps, slot, saved, values, L0, rec.n, target, s);
      continue;
    }
    be.to_device(slot + ps.offset, saved, ps.bytes, s);
    const int64_t m = ps.ratio, base = target - target % m, D = ps.D;
    const float* scores = values + rec.n * D;
    auto* pending = reinterpret_cast<float*>(slot + ps.offset);
    for (int64_t p = std::max(base, L0); p < target; ++p) {
      const int64_t t = p - base, row = p - L0;
      be.to_device(pending + t * D, values + row * D, D * int64_t(sizeof(float)), s);
      be.to_device(pending + (m - 1 + t) * D, scores + row * D, D * int64_t(sizeof(float)), s);
    }
  }
  be.synchronize(s);
  // The Engram history: the last hist ids of (history before, the kept tokens).
  const int64_t hist = layout.history_len();
  if (hist > 0) {
    std::vector<int32_t> all(rec.history);
    all.insert(all.end(), rec.tokens.begin(), rec.tokens.begin() + (target - L0));
    std::copy(all.end() - hist, all.end(), history);
  }
}

}  // namespace dsv41rt::model
