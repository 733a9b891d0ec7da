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
  std::vector<PendingSource> out;
  for (const LayerPlan& layer : plan.layers) {
    if (layer.role != LayerRole::kFull || layer.ratio < 2) continue;
    out.push_back({layer.index, layer.ratio, layout.pending_offset(layer.index),
                   pending_compressor_bytes(plan.config, layer)});
  }
  return out;
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
  int64_t pending_bytes = 0;
  for (const PendingSource& ps : sources) pending_bytes += ps.bytes;
  rec.pending.resize(size_t(pending_bytes));
  rec.compressor_rows.resize(sources.size() * size_t(2 * n * plan.config.head_dim));

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
  const int64_t RB = layout.window_row_bytes(), D = plan.config.head_dim;
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
  // group `target` ends in (target - target % m .. target - 1 that are >= L0).
  const std::vector<PendingSource> sources = pending_sources(plan, layout);
  int64_t off = 0;
  for (size_t si = 0; si < sources.size(); ++si) {
    const PendingSource& ps = sources[si];
    be.to_device(slot + ps.offset, rec.pending.data() + off, ps.bytes, s);
    off += ps.bytes;
    const int64_t m = ps.ratio, base = target - target % m;
    const float* values = rec.compressor_rows.data() + int64_t(si) * 2 * rec.n * D;
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
