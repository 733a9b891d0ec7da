// Undoing the last positions of one request's state exactly (spec §7.4: speculative verification
// writes k + 1 positions and keeps only the accepted ones).
//
// What a forward of n positions at length L0 changes, and how each part goes back to any length
// L in [L0, L0 + n]:
//   - token pages (compressed entries, index keys): position-addressed, and the counts follow
//     from the length, so entries of positions >= L are simply no longer read (the caller gives
//     back the pages past pages_for(L));
//   - window rings: the forward overwrote the ring rows of its positions; the record keeps the
//     rows they replaced (positions L0 - W .. of the same ring indices) and puts them back;
//   - pending compressor rows (ratio >= 2 sources): a length L with L mod m != 0 needs the raw
//     value / score rows of positions L - L mod m .. L - 1, which may be the forward's own rows
//     (pooled into an entry and no longer pending after it): the forward copies its raw rows into
//     the record as it runs (ModelRunner::capture_compressor), the rows pending before it are
//     kept too;
//   - the Engram history: the last max_ngram - 1 ids of (history before, the forward's tokens).
// Dequantised workspace rows never outlive a forward (DequantWorkspaces::begin_forward), so
// nothing there can hold a dropped entry; the restore starts a new workspace epoch anyway.
//
// The rule: a forward of n <= W positions (W = sliding_window) can be undone to any length in
// [L0, L0 + n]; a longer one only as a whole (to L0), since it overwrote ring rows of its own
// earlier positions. Undoing may be repeated (e.g. r1 then r2 positions) down to L0 until the
// next forward replaces the record.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "runtime/model/backend.h"
#include "runtime/model/layer_plan.h"
#include "runtime/model/state_layout.h"

namespace dsv41rt::model {

/// What one forward of one request overwrote and cannot recompute (host copies).
struct UndoRecord {
  int64_t length = -1;  ///< the request's length before the forward (L0); -1: nothing recorded
  int64_t n = 0;        ///< positions the forward added
  int64_t window = 0;   ///< the ring's rows (sliding_window) when recorded
  std::vector<int32_t> tokens;   ///< the forward's tokens (the Engram history of shorter lengths)
  std::vector<int32_t> history;  ///< the Engram history before the forward
  /// Per layer, the ring rows of positions L0 .. L0 + min(n, W) - 1 before the forward, in that
  /// order (what those positions overwrote).
  std::vector<uint8_t> ring;
  /// Every ratio >= 2 source's pending rows before the forward (pending_compressor_bytes each).
  std::vector<uint8_t> pending;
  /// Per ratio >= 2 source, the forward's raw compressor rows: values [n, D] then scores [n, D].
  std::vector<float> compressor_rows;

  bool recorded() const { return length >= 0; }
  /// Whether `target` can be restored from a state of length `current` (one this record's
  /// forward produced, possibly undone in part already).
  bool can_restore(int64_t current, int64_t target) const;
};

/// A compressor whose raw rows stay pending between forwards (a Full layer of ratio >= 2).
struct PendingSource {
  int layer = -1;
  int64_t ratio = 0;
  int64_t offset = 0;  ///< in the slot
  int64_t bytes = 0;   ///< (ratio - 1) value rows, then (ratio - 1) score rows, FP32 head_dim
};
std::vector<PendingSource> pending_sources(const ModelPlan& plan, const StateLayout& layout);

/// Saves into `rec` what a forward of `tokens[0..n)` at `length` will overwrite in `slot`
/// (backend memory; its Engram history is `history`, host, history_len() ids). Synchronous.
void save_undo(Backend& be, const ModelPlan& plan, const StateLayout& layout, const uint8_t* slot,
               const int32_t* history, int64_t length, const int32_t* tokens, int64_t n,
               UndoRecord& rec);

/// Where the forward copies its raw compressor rows: per ratio >= 2 source layer, `n` value rows
/// then `n` score rows of head_dim floats, in backend memory.
struct CompressorCapture {
  int64_t row0 = 0, n = 0;  ///< the item's first row in the forward, its rows
  std::map<int, float*> rows;
};

/// Puts `slot` (and `history`) back to the state of length `target`, from a state of length
/// `current` that `rec`'s forward produced. Throws Error(kOutOfRange) when the rule does not
/// allow it. Synchronous. The caller drops the pages past the new length.
void restore_undo(Backend& be, const ModelPlan& plan, const StateLayout& layout, uint8_t* slot,
                  int32_t* history, const UndoRecord& rec, int64_t current, int64_t target);

}  // namespace dsv41rt::model
