#include "runtime/model/v4_compressor_stage.h"

#include "core/status.h"

namespace dsv41rt::model {

void v4_compressor_stage(Backend& be, const kernels::V4CompressorWeights& w, const Matrix& wkv,
                         const Matrix& wgate, const V4CompressorBatch& b,
                         const V4CompressorTarget& t, int64_t rope_dim, const float* inv_freq,
                         float* a, float* s, float* entries, Stream stream) {
  DSV41RT_CHECK(b.rows >= 0 && b.items >= 0 && b.groups >= 0, "v4_compressor_stage: rows=", b.rows,
                " items=", b.items, " groups=", b.groups);
  DSV41RT_CHECK(rope_dim >= 0 && rope_dim <= w.D && rope_dim % 2 == 0,
                "v4_compressor_stage: rope_dim ", rope_dim, " for entries of width ", w.D);
  if (b.rows == 0) return;
  const int64_t W = w.width();
  be.linear(b.x, wkv, b.rows, w.H, W, a, false, stream);
  be.linear(b.x, wgate, b.rows, w.H, W, s, false, stream);
  be.v4_compress(w, a, s, b.slots, t.state_offset, b.items, b.length, b.row0, b.new_rows, b.group0,
                 entries, stream);
  if (b.groups == 0) return;
  be.apply_rope(entries, b.groups, 1, w.D, rope_dim, b.group_position, inv_freq, false, stream);
  if (t.rotate) be.walsh_hadamard(entries, b.groups, w.D, entries, stream);
  be.pack_paged(t.format, t.pages, w.D, b.groups, entries, b.group_item, b.group_entry, stream);
}

}  // namespace dsv41rt::model
