#include "kernels/v4_compressor.h"

#include <cmath>
#include <vector>

#include "core/status.h"
#include "kernels/linear.h"
#include "kernels/rms_norm.h"

namespace dsv41rt::kernels::cpu {
namespace {

using kernels::V4CompressorState;
using kernels::V4CompressorWeights;

void check_weights(const V4CompressorWeights& w, const char* op) {
  DSV41RT_CHECK(w.H > 0 && w.D > 0, op, ": bad sizes H=", w.H, " D=", w.D);
  DSV41RT_CHECK(w.ratio >= 1, op, ": ratio ", w.ratio, " must be >= 1");
  DSV41RT_CHECK(w.wkv && w.wgate && w.ape && w.norm_weight, op,
                ": null weight pointer (wkv, wgate, ape and norm_weight are all required)");
  DSV41RT_CHECK(std::isfinite(w.eps) && w.eps >= 0, op, ": bad eps ", w.eps);
}

/// Projects n rows x [n, H] at absolute positions first .. first + n - 1 into a, s [n, W]:
/// a = x · wkv^T, s = x · wgate^T + ape[t mod ratio] (one add per element after the dot product,
/// as transformers adds position_bias to the projected gate).
void project(const V4CompressorWeights& w, const float* x, int64_t n, int64_t first, float* a,
             float* s) {
  const int64_t W = w.width();
  linear(x, w.wkv, n, w.H, W, a);
  linear(x, w.wgate, n, w.H, W, s);
  for (int64_t r = 0; r < n; ++r) {
    const float* ape = w.ape + ((first + r) % w.ratio) * W;
    for (int64_t c = 0; c < W; ++c) s[r * W + c] += ape[c];
  }
}

/// One entry from its group's rows. group_a / group_s: [ratio, W] rows of group j (scores with
/// APE). prev_a / prev_s: overlap only, [ratio, D] A-halves of group j-1 with row stride
/// prev_stride, or nullptr for j = 0 (masked). Writes the normalised entry [D].
void pool_entry(const V4CompressorWeights& w, const float* group_a, const float* group_s,
                const float* prev_a, const float* prev_s, int64_t prev_stride, float* entry) {
  const int64_t m = w.ratio, D = w.D, W = w.width();
  const int64_t b_off = w.overlap ? D : 0;  // the B-half (or the whole row without overlap)
  std::vector<float> pooled(D);
  for (int64_t c = 0; c < D; ++c) {
    // Slot order: A-halves of group j-1 (when present), then the rows of group j.
    float mx = -INFINITY;
    if (prev_a)
      for (int64_t t = 0; t < m; ++t) mx = std::fmax(mx, prev_s[t * prev_stride + c]);
    for (int64_t t = 0; t < m; ++t) mx = std::fmax(mx, group_s[t * W + b_off + c]);
    float denom = 0;
    if (prev_a)
      for (int64_t t = 0; t < m; ++t) denom += std::exp(prev_s[t * prev_stride + c] - mx);
    for (int64_t t = 0; t < m; ++t) denom += std::exp(group_s[t * W + b_off + c] - mx);
    float acc = 0;
    if (prev_a)
      for (int64_t t = 0; t < m; ++t)
        acc += prev_a[t * prev_stride + c] * (std::exp(prev_s[t * prev_stride + c] - mx) / denom);
    for (int64_t t = 0; t < m; ++t) {
      const int64_t i = t * W + b_off + c;
      acc += group_a[i] * (std::exp(group_s[i] - mx) / denom);
    }
    pooled[c] = acc;
  }
  rms_norm(pooled.data(), w.norm_weight, 1, D, w.eps, entry);
}

}  // namespace

}  // namespace dsv41rt::kernels::cpu

namespace dsv41rt::kernels {

int64_t v4_compressor_state_floats(const V4CompressorWeights& w) {
  DSV41RT_CHECK(w.ratio >= 1 && w.D > 0, "v4_compressor_state_floats: bad sizes ratio=", w.ratio,
                " D=", w.D);
  return 2 * w.ratio * w.width() + (w.overlap ? 2 * w.ratio * w.D : 0);
}

V4CompressorRows v4_compressor_rows(const V4CompressorWeights& w, float* base) {
  DSV41RT_CHECK(base != nullptr, "v4_compressor_rows: null state");
  const int64_t pending = w.ratio * w.width(), prev = w.ratio * w.D;
  V4CompressorRows r;
  r.pending_a = base;
  r.pending_s = base + pending;
  if (w.overlap) {
    r.prev_a = base + 2 * pending;
    r.prev_s = base + 2 * pending + prev;
  }
  return r;
}

V4CompressorState::V4CompressorState(const V4CompressorWeights& w)
    : ratio(w.ratio), W(w.width()), D(w.D), overlap(w.overlap) {
  flat.assign(size_t(v4_compressor_state_floats(w)), 0.0f);
}

}  // namespace dsv41rt::kernels

namespace dsv41rt::kernels::cpu {

void v4_compress_prefill(const V4CompressorWeights& w, const float* x, int64_t T, float* entries) {
  check_weights(w, "v4_compress_prefill");
  DSV41RT_CHECK(T >= 0, "v4_compress_prefill: T=", T);
  const int64_t groups = T / w.ratio;
  if (groups == 0) return;
  DSV41RT_CHECK(x && entries, "v4_compress_prefill: null x or entries");
  const int64_t m = w.ratio, W = w.width(), n = groups * m;
  std::vector<float> a(n * W), s(n * W);
  project(w, x, n, 0, a.data(), s.data());
  for (int64_t j = 0; j < groups; ++j) {
    const float* ga = a.data() + j * m * W;
    const float* gs = s.data() + j * m * W;
    // The A-halves of group j-1 are the first D channels of its rows (stride W).
    const bool prev = w.overlap && j > 0;
    pool_entry(w, ga, gs, prev ? ga - m * W : nullptr, prev ? gs - m * W : nullptr, W,
               entries + j * w.D);
  }
}

namespace {

void check_rows(const V4CompressorWeights& w, const V4CompressorRows& st, int64_t tokens, int64_t n,
                const char* op) {
  DSV41RT_CHECK(st.pending_a && st.pending_s && (!w.overlap || (st.prev_a && st.prev_s)), op,
                ": state rows missing (overlap=", w.overlap, ")");
  DSV41RT_CHECK(tokens >= 0 && n >= 0, op, ": tokens=", tokens, " n=", n);
}

// Called once row `tokens` (absolute position) is in the pending rows: if it completes its
// group, pools the entry into `entry`, keeps the group's A-halves and returns true.
bool complete_group(const V4CompressorWeights& w, const V4CompressorRows& st, int64_t tokens,
                    float* entry, const char* op) {
  const int64_t m = w.ratio, W = w.width(), D = w.D;
  if (tokens % m != m - 1) return false;
  DSV41RT_CHECK(entry != nullptr, op, ": null entries");
  // Group tokens / m is complete; group 0 has no predecessor (masked A slots).
  const bool prev = w.overlap && tokens >= m;
  pool_entry(w, st.pending_a, st.pending_s, prev ? st.prev_a : nullptr, prev ? st.prev_s : nullptr,
             D, entry);
  if (w.overlap) {  // keep this group's A-halves for the next entry
    for (int64_t t = 0; t < m; ++t)
      for (int64_t c = 0; c < D; ++c) {
        st.prev_a[t * D + c] = st.pending_a[t * W + c];
        st.prev_s[t * D + c] = st.pending_s[t * W + c];
      }
  }
  return true;
}

}  // namespace

int64_t v4_compress_append_rows(const V4CompressorWeights& w, const V4CompressorRows& st,
                                int64_t tokens, const float* x, int64_t n, float* entries) {
  check_weights(w, "v4_compress_append");
  check_rows(w, st, tokens, n, "v4_compress_append");
  if (n == 0) return 0;
  DSV41RT_CHECK(x != nullptr, "v4_compress_append: null x");
  const int64_t m = w.ratio, W = w.width();
  int64_t written = 0;
  for (int64_t r = 0; r < n; ++r, ++tokens) {
    // Row by row: `linear` rows do not depend on the batch, so this equals prefill's projection.
    const int64_t slot = tokens % m;
    project(w, x + r * w.H, 1, tokens, st.pending_a + slot * W, st.pending_s + slot * W);
    float* entry = entries ? entries + written * w.D : nullptr;
    written += complete_group(w, st, tokens, entry, "v4_compress_append");
  }
  return written;
}

int64_t v4_compress_projected(const V4CompressorWeights& w, const V4CompressorRows& st,
                              int64_t tokens, const float* a, const float* s, int64_t n,
                              float* entries) {
  V4CompressorWeights checked = w;  // the projections are done: only the pooling weights count
  checked.wkv = checked.wgate = checked.ape;
  check_weights(checked, "v4_compress_projected");
  check_rows(w, st, tokens, n, "v4_compress_projected");
  if (n == 0) return 0;
  DSV41RT_CHECK(a && s, "v4_compress_projected: null a or s");
  const int64_t m = w.ratio, W = w.width();
  int64_t written = 0;
  for (int64_t r = 0; r < n; ++r, ++tokens) {
    const int64_t slot = tokens % m;
    const float* ape = w.ape + slot * W;  // = ape[t mod m]: one add after the dot product
    float* pa = st.pending_a + slot * W;
    float* ps = st.pending_s + slot * W;
    for (int64_t c = 0; c < W; ++c) {
      pa[c] = a[r * W + c];
      ps[c] = s[r * W + c] + ape[c];
    }
    float* entry = entries ? entries + written * w.D : nullptr;
    written += complete_group(w, st, tokens, entry, "v4_compress_projected");
  }
  return written;
}

void v4_compress_paged(const V4CompressorWeights& w, const float* a, const float* s,
                       uint8_t* const* slots, int64_t state_offset, int64_t items,
                       const int64_t* length, const int64_t* row0, const int64_t* n,
                       const int64_t* entry0, float* entries) {
  DSV41RT_CHECK(items >= 0 && state_offset >= 0, "v4_compress: items=", items,
                " state_offset=", state_offset);
  if (items == 0) return;
  DSV41RT_CHECK(slots && length && row0 && n && entry0, "v4_compress: null metadata");
  const int64_t W = w.width();
  for (int64_t b = 0; b < items; ++b) {
    DSV41RT_CHECK(slots[b] != nullptr, "v4_compress: item ", b, " has no slot");
    float* base = reinterpret_cast<float*>(slots[b] + state_offset);
    v4_compress_projected(w, kernels::v4_compressor_rows(w, base), length[b], a + row0[b] * W,
                          s + row0[b] * W, n[b], entries ? entries + entry0[b] * w.D : nullptr);
  }
}

int64_t v4_compress_append(const V4CompressorWeights& w, V4CompressorState& st, const float* x,
                           int64_t n, float* entries) {
  DSV41RT_CHECK(st.ratio == w.ratio && st.W == w.width() && st.D == w.D && st.overlap == w.overlap,
                "v4_compress_append: state built for ratio=", st.ratio, " W=", st.W, " D=", st.D,
                " overlap=", st.overlap, ", weights have ratio=", w.ratio, " W=", w.width(),
                " D=", w.D, " overlap=", w.overlap);
  DSV41RT_CHECK(st.tokens >= 0 && int64_t(st.flat.size()) == v4_compressor_state_floats(w),
                "v4_compress_append: corrupt state (tokens=", st.tokens, ")");
  const int64_t written =
      v4_compress_append_rows(w, v4_compressor_rows(w, st.flat.data()), st.tokens, x, n, entries);
  st.tokens += n;
  return written;
}

}  // namespace dsv41rt::kernels::cpu
