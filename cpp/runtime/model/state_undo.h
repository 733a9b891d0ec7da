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
//   - the Engram history: the last max_ngram - 1 ids of (history before, the forward's tokens);
//   - DeepSeek-V4 (state_undo_v4.cc): every compressor's flat state (kernels/v4_compressor.h:
//     each CSA / HCA layer's, each CSA layer's indexer compressor's) is saved whole, and the
//     forward's projected rows (a, s with the APE added, as the state stores them) are captured;
//     the state of a length L is rebuilt from the two: each pending row holds the latest position
//     < L of its residue, the previous group's A-halves those of group L / m - 1.
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
  /// Every pending source's rows before the forward (PendingSource::bytes each).
  std::vector<uint8_t> pending;
  /// Per pending source, the forward's compressor rows: values [n, width] then scores
  /// [n, width] (V4: a, then s with the APE added).
  std::vector<float> compressor_rows;

  bool recorded() const { return length >= 0; }
  /// Whether `target` can be restored from a state of length `current` (one this record's
  /// forward produced, possibly undone in part already).
  bool can_restore(int64_t current, int64_t target) const;
};

/// The key of a compressor in CompressorCapture::rows: a layer's (main) compressor, or (V4 CSA)
/// its indexer's compressor.
inline int capture_key(int layer, bool indexer) { return 2 * layer + (indexer ? 1 : 0); }

/// A compressor whose rows stay pending between forwards: a V4.1 Full layer of ratio >= 2, or
/// (DeepSeek-V4) each CSA / HCA layer's compressor and each CSA layer's indexer compressor.
struct PendingSource {
  int layer = -1;
  int64_t ratio = 0;
  int64_t offset = 0;  ///< in the slot
  /// V4.1: (ratio - 1) value rows, then (ratio - 1) score rows, FP32 head_dim; V4: the flat state
  /// of kernels/v4_compressor.h (pending_a, pending_s [ratio, width], prev_a, prev_s [ratio, D])
  int64_t bytes = 0;
  bool v4 = false;
  bool indexer = false;  ///< V4 CSA: the indexer's compressor (index_head_dim)
  bool overlap = false;  ///< V4 CSA and its indexer: the state keeps the last group's A-halves
  int64_t D = 0;         ///< entry width
  int64_t width = 0;     ///< floats of one captured row: V4.1 head_dim, V4 2D with overlap else D
  int key() const { return capture_key(layer, indexer); }
  /// Floats the forward's capture of `n` rows takes in backend memory: values [n, width], scores
  /// [n, width], and for V4 the APE [ratio, width] (the scores are captured before it is added).
  int64_t capture_floats(int64_t n) const { return 2 * n * width + (v4 ? ratio * width : 0); }
};
std::vector<PendingSource> pending_sources(const ModelPlan& plan, const StateLayout& layout);

/// Saves into `rec` what a forward of `tokens[0..n)` at `length` will overwrite in `slot`
/// (backend memory; its Engram history is `history`, host, history_len() ids). Synchronous.
void save_undo(Backend& be, const ModelPlan& plan, const StateLayout& layout, const uint8_t* slot,
               const int32_t* history, int64_t length, const int32_t* tokens, int64_t n,
               UndoRecord& rec);

/// Where the forward copies its compressor rows, in backend memory: per pending source (keyed by
/// PendingSource::key) PendingSource::capture_floats(n) floats.
struct CompressorCapture {
  int64_t row0 = 0, n = 0;  ///< the item's first row in the forward, its rows
  std::map<int, float*> rows;
};

/// Into `out` (2 * n * ps.width floats of UndoRecord::compressor_rows) the rows of one source's
/// capture (host copy, ps.capture_floats(n) floats) of a forward of n rows at `length`: V4.1's
/// as they are, V4's scores with the APE of their position added (as v4_compress adds it).
void finish_capture(const PendingSource& ps, int64_t length, int64_t n, const float* captured,
                    float* out);

/// DeepSeek-V4: puts one compressor's flat state at `slot` + ps.offset back to the state of length
/// `target` in [L0, L0 + n] from its state before the forward (`saved`, ps.bytes, host) and the
/// forward's rows (`rows`: a [n, width], then s [n, width] with the APE; state_undo_v4.cc).
void restore_v4_compressor(Backend& be, const PendingSource& ps, uint8_t* slot,
                           const uint8_t* saved, const float* rows, int64_t L0, int64_t n,
                           int64_t target, Stream s);

/// Puts `slot` (and `history`) back to the state of length `target`, from a state of length
/// `current` that `rec`'s forward produced. Throws Error(kOutOfRange) when the rule does not
/// allow it. Synchronous. The caller drops the pages past the new length.
void restore_undo(Backend& be, const ModelPlan& plan, const StateLayout& layout, uint8_t* slot,
                  int32_t* history, const UndoRecord& rec, int64_t current, int64_t target);

}  // namespace dsv41rt::model
