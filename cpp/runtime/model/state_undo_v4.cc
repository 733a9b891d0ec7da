// Undoing the last positions of a DeepSeek-V4 compressor's state (state_undo.h; the state is
// kernels/v4_compressor.h's flat FP32 pending_a, pending_s [m, W], with overlap prev_a, prev_s
// [m, D]).
//
// Every row of that state is a function of the length L alone (one forward or many leave the
// same bytes): pending row t holds the projected row (a, s + APE) of the latest position p < L
// with p mod m = t (rows of the current group below L mod m, of the group before above it; none
// written if p < 0), and, once L >= m, prev row t the A-halves (first D floats of a, s) of
// position m·(L / m - 1) + t, the last complete group's. A target L in [L0, L0 + n] therefore
// takes each such row from the forward's captured rows where p >= L0, and from the state saved
// before the forward otherwise: a position p < L0 that is still the latest of its residue below
// L was the latest below L0 too, so the saved pending row t holds it, and the saved prev rows
// hold group L / m - 1 iff that group was complete at L0. The result equals bitwise the state
// the same tokens leave fed without the dropped positions.
#include <algorithm>
#include <vector>

#include "core/status.h"
#include "runtime/model/state_undo.h"

namespace dsv41rt::model {

void restore_v4_compressor(Backend& be, const PendingSource& ps, uint8_t* slot,
                           const uint8_t* saved, const float* rows, int64_t L0, int64_t n,
                           int64_t target, Stream s) {
  const int64_t m = ps.ratio, W = ps.width, D = ps.D;
  const int64_t floats = 2 * m * W + (ps.overlap ? 2 * m * D : 0);
  DSV41RT_CHECK_CODE(kInternal, ps.v4 && floats * int64_t(sizeof(float)) == ps.bytes,
                     "restore_v4_compressor: layer ", ps.layer, " state of ", ps.bytes,
                     " bytes for ratio ", m, " width ", W);
  DSV41RT_CHECK_CODE(kInternal, L0 >= 0 && target >= L0 && target <= L0 + n,
                     "restore_v4_compressor: target ", target, " outside [", L0, ", ", L0 + n, "]");
  std::vector<float> state(static_cast<size_t>(floats));
  std::copy(saved, saved + ps.bytes, reinterpret_cast<uint8_t*>(state.data()));
  std::vector<float> before(state);  // the saved rows, read while `state` is being rebuilt
  float* pending_a = state.data();
  float* pending_s = pending_a + m * W;
  const float* a = rows;           // [n, W]
  const float* sc = rows + n * W;  // [n, W], APE added
  for (int64_t t = 0; t < m && target > 0; ++t) {
    const int64_t p =
        target - 1 - ((target - 1 - t) % m + m) % m;  // latest p < target, p = t mod m
    if (p < L0) continue;                             // the saved row holds it
    std::copy(a + (p - L0) * W, a + (p - L0 + 1) * W, pending_a + t * W);
    std::copy(sc + (p - L0) * W, sc + (p - L0 + 1) * W, pending_s + t * W);
  }
  if (ps.overlap && target >= m) {
    float* prev_a = state.data() + 2 * m * W;
    float* prev_s = prev_a + m * D;
    const int64_t first = m * (target / m - 1);  // the last complete group's first position
    for (int64_t t = 0; t < m; ++t) {
      const int64_t p = first + t;
      const float *src_a = nullptr, *src_s = nullptr;
      if (p >= L0) {
        src_a = a + (p - L0) * W;
        src_s = sc + (p - L0) * W;
      } else if (first + m <= L0) {
        continue;  // the group was complete before the forward: the saved prev rows are its
      } else {     // the group was pending before the forward: its saved pending row t is p
        src_a = before.data() + t * W;
        src_s = before.data() + m * W + t * W;
      }
      std::copy(src_a, src_a + D, prev_a + t * D);
      std::copy(src_s, src_s + D, prev_s + t * D);
    }
  }
  be.to_device(slot + ps.offset, state.data(), ps.bytes, s);
  be.synchronize(s);  // `state` is host memory of this call
}

}  // namespace dsv41rt::model
