// The DeepSeek-V4 parts of one layer's attention (docs/design/v4.md, spec §2.6, §2.10), called
// from the shared sequence in model_runner_attention.cc by role: a CSA layer's compressor and its
// indexer's compressor, an HCA layer's compressor, and HCA's selection of every visible entry.
#include "runtime/model/model_runner.h"
#include "runtime/model/v4_compressor_stage.h"

namespace dsv41rt::model {

namespace {

kernels::V4CompressorWeights compressor_weights(int64_t H, int64_t D, int64_t ratio,
                                                const float* ape, const float* norm, float eps) {
  kernels::V4CompressorWeights cw;
  cw.H = H;
  cw.D = D;
  cw.ratio = ratio;
  cw.overlap = ratio == 4;  // CSA and its indexer pool overlapping windows; HCA does not
  cw.ape = ape;
  cw.norm_weight = norm;
  cw.eps = eps;
  return cw;
}

}  // namespace

// CSA / HCA: the entries of the groups this forward completes (rows `x` of every batch row), into
// the layer's own page rows; CSA also the indexer's keys (its own compressor at index_head_dim).
void ModelRunner::v4_compressors(const LayerPlan& layer, const LayerWeights& w,
                                 const ForwardPlan& f, const float* x, Stream s) {
  const ModelConfig& c = plan_.config;
  const int64_t H = c.hidden_size, m = layer.ratio, N = f.rows;
  const float eps = float(c.rms_norm_eps);
  const RatioPlan& rp = f.ratio(int(m));
  const ForwardMeta::Ratio& mr = meta_.ratio.at(int(m));
  V4CompressorBatch b;
  b.x = x;
  b.rows = N;
  b.items = f.items;
  b.groups = int64_t(rp.group_item.size());
  b.slots = meta_.slots;
  b.length = meta_.length;
  b.row0 = meta_.row0;
  b.new_rows = meta_.new_rows;
  b.group0 = mr.group0;
  b.group_item = mr.group_item;
  b.group_entry = mr.group_entry;
  b.group_position = mr.group_position;
  const CacheFormats& fmt = layout_.formats();
  auto run = [&](const kernels::V4CompressorWeights& cw, const Matrix& wkv, const Matrix& wgate,
                 int64_t state_offset, bool key, kernels::RowFormat format) {
    V4CompressorTarget t;
    t.state_offset = state_offset;
    t.pages = paged(layer.index, key, f);
    t.format = format;
    t.rotate = key && format != kernels::RowFormat::kF32;  // quantised index keys (spec 2.6.4)
    float* a = buf(cv_, N * cw.width());
    float* sc = buf(cs_, N * cw.width());
    float* entries = buf(latent_, b.groups * cw.D);
    v4_compressor_stage(be_, cw, wkv, wgate, b, t, c.qk_rope_head_dim, w.inv_freq, a, sc, entries,
                        s);
    // Rollback (state_undo.h): the rows of the items whose forward may be undone, and the APE
    // (finish_capture adds it to the scores as v4_compress does).
    const int64_t W = cw.width(), F = int64_t(sizeof(float));
    for (const CompressorCapture& k : capture_compressor) {
      float* dst = k.rows.at(capture_key(layer.index, key));
      be_.copy(dst, a + k.row0 * W, k.n * W * F, s);
      be_.copy(dst + k.n * W, sc + k.row0 * W, k.n * W * F, s);
      be_.copy(dst + 2 * k.n * W, cw.ape, m * W * F, s);
    }
  };
  run(compressor_weights(H, c.head_dim, m, w.comp_ape, w.comp_norm, eps), w.comp_wkv, w.comp_wgate,
      layout_.pending_offset(layer.index), false, fmt.kv);
  if (layer.role == LayerRole::kCsa) {
    run(compressor_weights(H, c.index_head_dim, m, w.idx_comp_ape, w.idx_comp_norm, eps),
        w.idx_comp_wkv, w.idx_comp_wgate, layout_.indexer_pending_offset(layer.index), true,
        fmt.key);
  }
}

// HCA: every entry a query row may see, in topk_select's form (width: the ratio's
// visible_width, the same for a decode batch run eagerly or as its bucket's graph).
void ModelRunner::hca_select(const LayerPlan& layer, const ForwardPlan& f, Stream s) {
  const int64_t T = f.ratio(layer.ratio).visible_width, NQ = meta_.nq;
  int32_t* sel = buf(topk_, NQ * T);
  if (NQ > 0 && T > 0) be_.visible_entries(meta_.q_ratio.at(layer.ratio).n_visible, NQ, T, sel, s);
  topk_source_ = layer.index;
}

}  // namespace dsv41rt::model
