// The attention block of one layer (spec §2): window KV, compressor, indexer, sparse attention,
// with the side streams of docs/design/cuda-executor.md and, under context parallelism, the
// all-gather of docs/design/context-parallel.md.
#include <cmath>

#include "core/status.h"
#include "runtime/model/model_runner.h"

namespace dsv41rt::model {

kernels::PagedRows ModelRunner::paged(int source_layer, bool key, const ForwardPlan& f) const {
  kernels::PagedRows p;
  p.pool = pool_.page_data(0);
  p.page_bytes = pool_.geometry().page_bytes;
  p.page_table = meta_.page_table;
  p.max_pages = f.max_pages;
  p.per_page = layout_.entries_per_page(source_layer);
  p.offset = layout_.entry_offset(source_layer, key);
  p.row_bytes = key ? layout_.key_row_bytes() : layout_.kv_row_bytes();
  return p;
}

// Full layers: the new entries of every item (spec §2.4), written to the pages.
void ModelRunner::compressor(const LayerPlan& layer, const LayerWeights& w, const ForwardPlan& f,
                             const float* x, Stream s) {
  const ModelConfig& c = plan_.config;
  const int64_t H = c.hidden_size, D = c.head_dim, DI = c.index_head_dim, m = layer.ratio;
  const int64_t N = f.rows, R = c.qk_rope_head_dim;
  const float eps = float(c.rms_norm_eps);
  const RatioPlan& rp = f.ratio(int(m));
  const ForwardMeta::Ratio& mr = meta_.ratio.at(int(m));
  const int64_t G = int64_t(rp.group_item.size());
  float* cv = buf(cv_, N * D);
  be_.linear(x, w.comp_wkv, N, H, D, cv, false, s);
  float* latent = cv;  // ratio 1: every row is a group of one (softmax weight exactly 1)
  float* keys = buf(latent_, G * (D + DI));
  if (m > 1) {
    float* cs = buf(cs_, N * D);
    be_.linear(x, w.comp_wgate, N, H, D, cs, false, s);
    latent = keys;
    keys += G * D;
    const int64_t pend = layout_.pending_offset(layer.index);
    be_.compress_pool_gather(cv, cs, meta_.slots, pend, G, m, D, mr.group_item, mr.group_pending,
                             mr.group_first, latent, s);
    be_.store_pending(cv, cs, meta_.slots, pend, m, D, int64_t(rp.left_item.size()), mr.left_item,
                      mr.left_src, mr.left_dst, s);
    for (const CompressorCapture& k : capture_compressor) {
      float* dst = k.rows.at(capture_key(layer.index, false));
      be_.copy(dst, cv + k.row0 * D, k.n * D * int64_t(sizeof(float)), s);
      be_.copy(dst + k.n * D, cs + k.row0 * D, k.n * D * int64_t(sizeof(float)), s);
    }
  }
  if (G == 0) return;
  be_.rms_norm(latent, w.comp_norm, G, D, eps, latent, s);
  // Index keys come from the un-rotated latent; then the latent itself is rotated and stored.
  be_.linear(latent, w.idx_wk, G, D, DI, keys, false, s);
  be_.rms_norm(keys, w.idx_k_norm, G, DI, eps, keys, s);
  be_.apply_rope(keys, G, 1, DI, R, mr.group_position, w.inv_freq, false, s);
  be_.apply_rope(latent, G, 1, D, R, mr.group_position, w.inv_freq, false, s);
  const CacheFormats& fmt = layout_.formats();
  be_.pack_paged(fmt.key, paged(layer.index, true, f), DI, G, keys, mr.group_item, mr.group_entry,
                 s);
  be_.pack_paged(fmt.kv, paged(layer.index, false, f), D, G, latent, mr.group_item, mr.group_entry,
                 s);
}

// Full and Reindex layers: indexer scores over the source's keys, candidates, top-k.
void ModelRunner::indexer(const LayerPlan& layer, const LayerWeights& w, const ForwardPlan& f,
                          Stream s) {
  const ModelConfig& c = plan_.config;
  // Queries, weights, scores and the top-k of the query rows (N of them).
  const int64_t H = c.hidden_size, N = meta_.nq, R = c.qk_rope_head_dim;
  const int64_t HI = c.index_n_heads, DI = c.index_head_dim, KI = c.index_topk;
  const RatioPlan& rp = f.ratio(layer.ratio);
  const ForwardMeta::Ratio& mr = meta_.ratio.at(layer.ratio);
  const ForwardMeta::QRatio& qv = meta_.q_ratio.at(layer.ratio);
  const int64_t T = rp.max_count;
  const kernels::RowFormat key_format = layout_.formats().key;
  float* qi = buf(qi_, N * HI * DI);
  float* wts = buf(wts_, N * HI);
  be_.linear(qr_.get(), w.idx_wq_b, N, c.q_lora_rank, HI * DI, qi, false, s);
  be_.apply_rope(qi, N, HI, DI, R, meta_.q_positions, w.inv_freq, false, s);
  // V4 with quantised keys rotates its queries as its keys (spec 2.7.1; orthogonal, so only the
  // FP4 rounding moves); V4.1 has no rotation and FP32 caches none either.
  if (!c.is_v41() && key_format != kernels::RowFormat::kF32) {
    be_.walsh_hadamard(qi, N * HI, DI, qi, s);
  }
  be_.cache_qdq(key_format, qi, N * HI, DI, s);  // the queries are MXFP4 too
  be_.linear(xn_.get(), w.idx_weights_proj, N, H, HI, wts, false, s);
  const float wscale = float(std::pow(double(DI), -0.5) * std::pow(double(HI), -0.5));
  be_.scale(wts, N * HI, wscale, s);
  if (layer.owns_compressor()) be_.wait(s, kComp);  // this layer's new keys
  float* scores = buf(scores_, N * T);
  int32_t* topk = buf(topk_, N * KI);
  // The keys as stored where the backend reads them so (the same bits), else unpacked to FP32
  // first. Not under context parallelism, like the attention's caches (attention()).
  if (attention_in_place && !comm_ && be_.indexer_reads_caches(key_format, HI, DI)) {
    kernels::IndexKeys keys;
    keys.format = key_format;
    keys.rows = paged(layer.kv_source, true, f);
    keys.query_item = meta_.q_row_item;
    be_.indexer_scores_cached(qi, keys, wts, qv.n_visible, N, HI, DI, T, scores, s);
  } else {
    float* ikeys = buf(ikeys_, rp.comp_rows * DI);
    be_.unpack_paged(key_format, paged(layer.kv_source, true, f), DI, f.items, T, mr.count,
                     mr.comp_offset, ikeys, s);
    // MXFP4 index caches (queries QDQ'd the same way above) hold BF16 values.
    be_.indexer_scores(qi, ikeys, qv.key_offset, wts, qv.n_visible, N, HI, DI, T,
                       key_format != kernels::RowFormat::kF32, scores, s);
  }
  if (layer.candidates == CandidateRole::kSource) {
    uint8_t* mask = buf(mask_, N * T);
    if (T > 0) {
      be_.candidate_blocks(scores, qv.n_visible, N, T, c.candidate_topk_blocks,
                           c.candidate_block_size, mask, s);
    }
    candidates_ratio_ = layer.ratio;
  } else if (layer.candidates == CandidateRole::kUses) {
    DSV41RT_CHECK(candidates_ratio_ == layer.ratio, "layer ", layer.index,
                  " uses candidates of ratio ", layer.ratio, " but the candidate source has ratio ",
                  candidates_ratio_);
    be_.apply_candidate_mask(scores, mask_.get(), N * T, s);
  }
  if (T > 0) {
    be_.topk_select(scores, N, T, KI, topk, s);
  } else {
    be_.fill(topk, 0xFF, N * KI * int64_t(sizeof(int32_t)), s);  // all -1
  }
  topk_source_ = layer.index;
}

void ModelRunner::attention(const LayerPlan& layer, const LayerWeights& w, const ForwardPlan& f) {
  const ModelConfig& c = plan_.config;
  // Under tensor parallelism this rank's heads (and their output groups) only.
  const int64_t H = c.hidden_size, D = c.head_dim, nh = c.num_attention_heads / tp();
  const int64_t R = c.qk_rope_head_dim, W = c.sliding_window, N = f.rows, NQ = meta_.nq;
  const float eps = float(c.rms_norm_eps);
  const Stream s = main();
  // Full, CSA and HCA layers compress; Full, Reindex and CSA run an indexer; HCA selects every
  // visible entry of its own (hca_select).
  const bool full = layer.owns_compressor();
  const bool v4 = !c.is_v41();
  const bool selects = layer.owns_indexer();
  float* qr = buf(qr_, NQ * c.q_lora_rank);
  float* q = buf(q_, NQ * nh * D);
  auto q_low_rank = [&](Stream qs) {
    be_.linear(xn_.get(), w.wq_a, NQ, H, c.q_lora_rank, qr, false, qs);
    be_.rms_norm(qr, w.q_norm, NQ, c.q_lora_rank, eps, qr, qs);
  };
  auto q_heads = [&](Stream qs) {
    be_.linear(qr, w.wq_b, NQ, c.q_lora_rank, nh * D, q, false, qs);
    // V4: every head's query RMS-normalised without a weight (transformers' q_b_norm).
    if (v4) be_.rms_norm(q, nullptr, NQ * nh, D, eps, q, qs);
    be_.apply_rope(q, NQ, nh, D, R, meta_.q_positions, w.inv_freq, false, qs);
  };
  auto compress = [&](const float* xs) {
    be_.link(kFork, s, side(1));
    if (v4) {
      v4_compressors(layer, w, f, xs, side(1));
    } else {
      compressor(layer, w, f, xs, side(1));
    }
    be_.record(kComp, side(1));
  };

  const float* xs = xn_.get();  // the state rows' hidden states (all rows)
  if (comm_) {
    // Context parallelism: the Q projection of this rank's rows runs on a side stream while
    // the main stream all-gathers every row's hidden state, BEFORE the other side streams fork
    // (collectives in a fixed order on one stream; docs/design/context-parallel.md). The
    // indexer follows the Q projection on the same side stream, after the compressor.
    be_.link(kFork, s, side(2));
    cp_mark(0, side(2));
    if (NQ > 0) q_low_rank(side(2)), q_heads(side(2));
    cp_mark(1, side(2));
    float* xg = buf(xg_, N * H);
    cp_mark(2, s);
    gather_rows(xn_.get(), H, N, xg, s);
    cp_mark(3, s);
    xs = xg;
    if (full) compress(xs);
    if (selects && NQ > 0) indexer(layer, w, f, side(2));
    if (selects) topk_source_ = layer.index;  // (no query rows: nothing selected, nothing read)
    be_.record(kIdx, side(2));
  } else {
    // Fork: the layer input xn is ready; the compressor needs nothing else.
    if (full) compress(xs);
    q_low_rank(s);
    if (selects) {
      be_.link(kQr, s, side(2));
      indexer(layer, w, f, side(2));
      be_.record(kIdx, side(2));
    }
    q_heads(s);  // on the main stream, overlapping the side streams
  }
  // The window KV of every row on the main stream.
  const CacheFormats& fmt = layout_.formats();
  float* kv_a = buf(kv_a_, (f.old_rows + N) * D);
  float* kv = kv_a + f.old_rows * D;  // this forward's rows follow the ring rows
  be_.linear(xs, w.wkv, N, H, D, kv, false, s);
  be_.rms_norm(kv, w.kv_norm, N, D, eps, kv, s);
  be_.apply_rope(kv, N, 1, D, R, meta_.positions, w.inv_freq, false, s);
  if (record_decisions) record_window_kv(layer.index, kv, N, D);
  be_.cache_qdq(fmt.window, kv, N, D, s);
  const kernels::RingRows ring{meta_.slots, layout_.window_offset(layer.index), W,
                               layout_.window_row_bytes()};
  // The quantised caches' rows (and this forward's rows after cache_qdq) are BF16 values.
  const bool keys_bf16 = fmt.window != kernels::RowFormat::kF32 &&
                         (layer.ratio == 0 || fmt.kv != kernels::RowFormat::kF32);
  // In place, the attention reads the older rows from the ring itself, so this forward's rows
  // enter the ring after it (store_window_rows below); otherwise they are unpacked first and the
  // store overlaps on a side stream. Read first, write last either way: a new row may replace
  // an older one another query of the forward still reads.
  const bool in_place = attention_in_place && !comm_ && be_.attention_reads_caches(keys_bf16, D) &&
                        be_.attention_reads_format(fmt.window) &&
                        (layer.ratio == 0 || be_.attention_reads_format(fmt.kv));
  auto store_window_rows = [&](Stream st) {
    be_.pack_ring(fmt.window, ring, D, N, kv, meta_.row_item, meta_.positions, meta_.store_window,
                  st);
  };
  if (!in_place) {
    be_.unpack_ring(fmt.window, ring, D, f.items, f.max_old, meta_.window_first, meta_.old_count,
                    meta_.old_offset, kv_a, s);
    be_.link(kKv, s, side(0));
    store_window_rows(side(0));
  }

  // Join the compressor, then the ratio's workspace (first consumer dequantises, the rest reuse).
  const float* comp = nullptr;
  int64_t comp_rows = 0;
  const ForwardMeta::Ratio* mr = nullptr;
  if (layer.ratio > 0) {
    const RatioPlan& rp = f.ratio(layer.ratio);
    mr = &meta_.ratio.at(layer.ratio);
    if (full) {
      if (side(1) != s) be_.wait(s, kComp);
      workspaces_.note_source_write(layer.index);
    }
    comp_rows = rp.comp_rows;
    const kernels::PagedRows src = paged(layer.kv_source, false, f);
    if (!in_place) {
      comp = static_cast<const float*>(
          workspaces_.acquire(layer.ratio, layer.kv_source, comp_rows, D * int64_t(sizeof(float)),
                              [&](void* dst, int64_t) {
                                be_.unpack_paged(fmt.kv, src, D, f.items, rp.max_count, mr->count,
                                                 mr->comp_offset, static_cast<float*>(dst), s);
                              }));
    }
  }
  if ((selects || comm_) && side(2) != s) be_.wait(s, kIdx);
  if (!in_place) be_.link(kStore, side(0), s);
  if (layer.role == LayerRole::kHca) hca_select(layer, f, s);
  // HCA attends every visible entry: its selection is as wide as the ratio's longest item's
  // context bucket (RatioPlan::visible_width).
  const int64_t KI = layer.role == LayerRole::kHca ? f.ratio(layer.ratio).visible_width
                     : layer.ratio > 0             ? c.index_topk
                                                   : 0;
  if (NQ == 0) {  // a CP rank without query rows: the state writes were its part
    if (in_place) store_window_rows(s);
    return;
  }
  if (KI > 0) {
    const int source = layer.role == LayerRole::kHca ? layer.index : layer.topk_source;
    DSV41RT_CHECK(topk_source_ == source, "layer ", layer.index, " expects the top-k of layer ",
                  source, ", found ", topk_source_);
  }
  // Attention of the query rows over the keys of every row.
  int32_t* idx = buf(idx_, NQ * (W + KI));
  be_.attention_indices(NQ, W, KI, meta_.q_row_item, meta_.q_positions, meta_.window_first,
                        meta_.length, meta_.old_offset, meta_.row0, f.old_rows,
                        KI ? topk_.get() : nullptr, mr ? mr->comp_offset : nullptr, f.old_rows + N,
                        idx, s);
  float* o = buf(o_, NQ * nh * D);
  const float scale = float(1.0 / std::sqrt(double(D)));
  if (in_place) {
    kernels::CachedKeys keys;
    keys.window_format = fmt.window;
    keys.ring = ring;
    keys.window_first = meta_.window_first;
    keys.old_offset = meta_.old_offset;
    keys.old_count = meta_.old_count;
    keys.old_rows = f.old_rows;
    keys.new_rows = kv;
    keys.new_count = N;
    if (mr) {
      keys.comp_format = fmt.kv;
      keys.comp = paged(layer.kv_source, false, f);
      keys.comp_offset = mr->comp_offset;
      keys.comp_count = mr->count;
      keys.comp_rows = comp_rows;
    }
    keys.query_item = meta_.q_row_item;
    be_.sparse_attention_cached(q, keys, idx, w.attn_sink, NQ, nh, D, W + KI, scale, o, s);
    store_window_rows(s);
  } else {
    be_.sparse_attention(q, kv_a, f.old_rows + N, comp, comp_rows, idx, w.attn_sink, NQ, nh, D,
                         W + KI, scale, keys_bf16, o, s);
  }
  be_.apply_rope(o, NQ, nh, D, R, meta_.q_positions, w.inv_freq, true, s);
  const int64_t ro = c.o_lora_rank, kg = c.num_attention_heads * D / c.o_groups;
  float* z = buf(z_, NQ * c.o_groups * ro);
  if (tp() == 1) {
    be_.grouped_linear(o, w.wo_a, NQ, c.o_groups, kg, ro, z, s);
  } else if (c.o_groups % tp() == 0) {  // this rank's groups, gathered
    const int64_t g = c.o_groups / tp();
    float* local = buf(tp_local_, NQ * g * ro);
    be_.grouped_linear(o, w.wo_a, NQ, g, kg, ro, local, s);
    gather_columns(local, NQ, g * ro, z, s);
  } else {  // more ranks than groups: the heads' outputs gathered, wo_a whole
    float* all = buf(tp_local_, NQ * c.num_attention_heads * D);
    gather_columns(o, NQ, nh * D, all, s);
    be_.grouped_linear(all, w.wo_a, NQ, c.o_groups, kg, ro, z, s);
  }
  // wo_b whole on every rank: its sums run in the one-rank order.
  be_.linear(z, w.wo_b, NQ, c.o_groups * ro, H, yv_.get(), false, s);
  if (record_decisions && selects) {
    record(decisions_.topk, decisions_.topk_width, layer.index, topk_.get(), NQ, KI);
  }
}

}  // namespace dsv41rt::model
