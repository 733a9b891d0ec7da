#include "runtime/model/cuda_executor_impl.h"

// The attention block of one layer on the GPU: window KV, compressor, indexer, sparse attention
// (spec §2), with the side streams of docs/design/cuda-executor.md and, under context
// parallelism, the all-gather of docs/design/context-parallel.md.
namespace dsv41rt::model {
namespace cuda_detail {

// Full layers: the new entries of every item (spec §2.4), written to the pages.
void CudaExecutor::compressor(const LayerPlan& layer, const CudaLayerWeights& w,
                              const ForwardPlan& f, const float* x, cudaStream_t s) {
  const ModelConfig& c = plan_.config;
  const int64_t H = c.hidden_size, D = c.head_dim, DI = c.index_head_dim, m = layer.ratio;
  const int64_t N = f.rows, R = c.qk_rope_head_dim;
  const float eps = float(c.rms_norm_eps);
  const RatioPlan& rp = f.ratio(m);
  const Meta::Ratio& mr = meta_.ratio.at(m);
  const int64_t G = int64_t(rp.group_item.size());
  float* cv = cv_.ensure(N * D, generation_);
  DSV41RT_CU(lin(x, w.comp_wkv, N, H, D, cv, false, s));
  float* latent = cv;  // ratio 1: every row is a group of one (softmax weight exactly 1)
  if (m > 1) {
    float* cs = cs_.ensure(N * D, generation_);
    DSV41RT_CU(lin(x, w.comp_wgate, N, H, D, cs, false, s));
    latent = ikeys_new_.ensure(std::max<int64_t>(G, 1) * std::max(D, DI) * 2, generation_);
    const int64_t pend = layout_->pending_offset(layer.index);
    DSV41RT_CU(kc::compress_pool_gather(cv, cs, meta_.slots, pend, G, m, D, mr.group_item,
                                        mr.group_pending, mr.group_first, latent, s));
    DSV41RT_CU(kc::store_pending(cv, cs, meta_.slots, pend, m, D, int64_t(rp.left_item.size()),
                                 mr.left_item, mr.left_src, mr.left_dst, s));
  }
  if (G == 0) return;
  float* keys =
      (m > 1 ? latent + G * D : ikeys_new_.ensure(std::max<int64_t>(G, 1) * DI, generation_));
  DSV41RT_CU(kc::rms_norm(latent, w.comp_norm, G, D, eps, latent, s));
  // Index keys come from the un-rotated latent; then the latent itself is rotated and stored.
  DSV41RT_CU(lin(latent, w.idx_wk, G, D, DI, keys, false, s));
  DSV41RT_CU(kc::rms_norm(keys, w.idx_k_norm, G, DI, eps, keys, s));
  DSV41RT_CU(kc::apply_rope(keys, G, 1, DI, R, mr.group_position, w.inv_freq, false, s));
  DSV41RT_CU(kc::apply_rope(latent, G, 1, D, R, mr.group_position, w.inv_freq, false, s));
  DSV41RT_CU(kc::pack_paged(key_fmt_, paged(layer.index, true, f), DI, G, keys, mr.group_item,
                            mr.group_entry, s));
  DSV41RT_CU(kc::pack_paged(kv_fmt_, paged(layer.index, false, f), D, G, latent, mr.group_item,
                            mr.group_entry, s));
}

// Full and Reindex layers: indexer scores over the source's keys, candidates, top-k.
void CudaExecutor::indexer(const LayerPlan& layer, const CudaLayerWeights& w, const ForwardPlan& f,
                           cudaStream_t s) {
  const ModelConfig& c = plan_.config;
  // Queries, weights, scores and the top-k of the query rows (N of them).
  const int64_t H = c.hidden_size, N = meta_.nq, R = c.qk_rope_head_dim;
  const int64_t HI = c.index_n_heads, DI = c.index_head_dim, KI = c.index_topk;
  const RatioPlan& rp = f.ratio(layer.ratio);
  const Meta::Ratio& mr = meta_.ratio.at(layer.ratio);
  const Meta::QRatio& qv = meta_.q_ratio.at(layer.ratio);
  const int64_t T = rp.max_count;
  float* qi = qi_.ensure(N * HI * DI, generation_);
  float* wts = wts_.ensure(N * HI, generation_);
  DSV41RT_CU(lin(qr_.get(), w.idx_wq_b, N, c.q_lora_rank, HI * DI, qi, false, s));
  DSV41RT_CU(kc::apply_rope(qi, N, HI, DI, R, meta_.q_positions, w.inv_freq, false, s));
  if (options_.cache_quant) DSV41RT_CU(kc::mxfp4_qdq(qi, N * HI, DI, qi, s));  // MXFP4 queries
  DSV41RT_CU(lin(xn_.get(), w.idx_weights_proj, N, H, HI, wts, false, s));
  const float wscale = float(std::pow(double(DI), -0.5) * std::pow(double(HI), -0.5));
  DSV41RT_CU(kc::scale_inplace(wts, N * HI, wscale, s));
  if (layer.role == LayerRole::kFull) st_->comp.link(side(1), s);  // this layer's new keys
  float* ikeys = ikeys_.ensure(std::max<int64_t>(rp.comp_rows, 1) * DI, generation_);
  float* scores = scores_.ensure(std::max<int64_t>(N * T, 1), generation_);
  int32_t* topk = topk_.ensure(N * KI, generation_);
  DSV41RT_CU(kc::unpack_paged(key_fmt_, paged(layer.kv_source, true, f), DI, f.items, T, mr.count,
                              mr.comp_offset, ikeys, s));
  DSV41RT_CU(kc::indexer_scores_offset(qi, ikeys, qv.key_offset, wts, qv.n_visible, N, HI, DI, T,
                                       scores, s));
  if (layer.candidates == CandidateRole::kSource) {
    uint8_t* mask = mask_.ensure(std::max<int64_t>(N * T, 1), generation_);
    if (T > 0) {
      DSV41RT_CU(kc::candidate_blocks(scores, qv.n_visible, N, T, c.candidate_topk_blocks,
                                      c.candidate_block_size, mask, s));
    }
    candidates_ratio_ = layer.ratio;
  } else if (layer.candidates == CandidateRole::kUses) {
    DSV41RT_CHECK(candidates_ratio_ == layer.ratio, "layer ", layer.index,
                  " uses candidates of ratio ", layer.ratio, " but the candidate source has ratio ",
                  candidates_ratio_);
    DSV41RT_CU(kc::apply_candidate_mask(scores, mask_.get(), N * T, s));
  }
  if (T > 0) {
    DSV41RT_CU(kc::topk_select(scores, N, T, KI, topk, s));
  } else {
    DSV41RT_CU(cudaMemsetAsync(topk, 0xFF, size_t(N * KI) * sizeof(int32_t), s));  // all -1
  }
  topk_source_ = layer.index;
}

void CudaExecutor::attention(const LayerPlan& layer, const CudaLayerWeights& w,
                             const ForwardPlan& f) {
  const ModelConfig& c = plan_.config;
  const int64_t H = c.hidden_size, D = c.head_dim, nh = c.num_attention_heads;
  const int64_t R = c.qk_rope_head_dim, W = c.sliding_window, N = f.rows, NQ = meta_.nq;
  const float eps = float(c.rms_norm_eps);
  const cudaStream_t s = main();
  const bool full = layer.role == LayerRole::kFull;
  const bool selects = full || layer.role == LayerRole::kReindex;
  float* qr = qr_.ensure(NQ * c.q_lora_rank, generation_);
  float* q = q_.ensure(NQ * nh * D, generation_);
  auto q_projection = [&](cudaStream_t qs) {
    DSV41RT_CU(lin(xn_.get(), w.wq_a, NQ, H, c.q_lora_rank, qr, false, qs));
    DSV41RT_CU(kc::rms_norm(qr, w.q_norm, NQ, c.q_lora_rank, eps, qr, qs));
    DSV41RT_CU(lin(qr, w.wq_b, NQ, c.q_lora_rank, nh * D, q, false, qs));
    DSV41RT_CU(kc::apply_rope(q, NQ, nh, D, R, meta_.q_positions, w.inv_freq, false, qs));
  };

  const float* xs = xn_.get();  // the state rows' hidden states (all rows)
  if (comm_) {
    // Context parallelism: the Q projection of this rank's rows runs on a side stream while
    // the main stream all-gathers every row's hidden state, BEFORE the other side streams fork
    // (collectives in a fixed order on one stream; docs/design/context-parallel.md). The
    // indexer follows the Q projection on the same side stream, after the compressor.
    st_->fork.link(s, side(2));
    cp_mark(0, side(2));
    if (NQ > 0) q_projection(side(2));
    cp_mark(1, side(2));
    float* xg = xg_.ensure(N * H, generation_);
    cp_mark(2, s);
    gather_rows(xn_.get(), H, N, xg, s);
    cp_mark(3, s);
    xs = xg;
    if (full) {
      st_->fork.link(s, side(1));
      compressor(layer, w, f, xs, side(1));
      if (side(1) != s) DSV41RT_CU(cudaEventRecord(st_->comp.get(), side(1)));
    }
    if (selects && NQ > 0) indexer(layer, w, f, side(2));
    if (selects) topk_source_ = layer.index;  // (no query rows: nothing selected, nothing read)
    if (side(2) != s) DSV41RT_CU(cudaEventRecord(st_->idx.get(), side(2)));
  } else {
    // Fork: the layer input xn is ready; the compressor needs nothing else.
    if (full) {
      st_->fork.link(s, side(1));
      compressor(layer, w, f, xs, side(1));
      if (side(1) != s) DSV41RT_CU(cudaEventRecord(st_->comp.get(), side(1)));
    }
    DSV41RT_CU(lin(xn_.get(), w.wq_a, NQ, H, c.q_lora_rank, qr, false, s));
    DSV41RT_CU(kc::rms_norm(qr, w.q_norm, NQ, c.q_lora_rank, eps, qr, s));
    if (selects) {
      st_->qr.link(s, side(2));
      indexer(layer, w, f, side(2));
      if (side(2) != s) DSV41RT_CU(cudaEventRecord(st_->idx.get(), side(2)));
    }
    // Q projection on the main stream, overlapping the side streams.
    DSV41RT_CU(lin(qr, w.wq_b, NQ, c.q_lora_rank, nh * D, q, false, s));
    DSV41RT_CU(kc::apply_rope(q, NQ, nh, D, R, meta_.q_positions, w.inv_freq, false, s));
  }
  // The window KV of every row on the main stream.
  float* kv_a = kv_a_.ensure((f.old_rows + N) * D, generation_);
  float* kv = kv_a + f.old_rows * D;  // this forward's rows follow the ring rows
  DSV41RT_CU(lin(xs, w.wkv, N, H, D, kv, false, s));
  DSV41RT_CU(kc::rms_norm(kv, w.kv_norm, N, D, eps, kv, s));
  DSV41RT_CU(kc::apply_rope(kv, N, 1, D, R, meta_.positions, w.inv_freq, false, s));
  if (options_.cache_quant) DSV41RT_CU(kc::fp8_window_qdq(kv, N, D, kv, s));
  kc::RingRows ring{meta_.slots, layout_->window_offset(layer.index), W,
                    layout_->window_codec().row_bytes};
  // Read first, write last: the older rows leave the ring before this forward's rows enter it.
  DSV41RT_CU(kc::unpack_ring(window_fmt_, ring, D, f.items, f.max_old, meta_.window_first,
                             meta_.old_count, meta_.old_offset, kv_a, s));
  st_->kv.link(s, side(0));
  DSV41RT_CU(kc::pack_ring(window_fmt_, ring, D, N, kv, meta_.row_item, meta_.positions,
                           meta_.store_window, side(0)));

  // Join the compressor, then the ratio's workspace (first consumer dequantises, the rest reuse).
  const float* comp = nullptr;
  int64_t comp_rows = 0;
  const Meta::Ratio* mr = nullptr;
  if (layer.ratio > 0) {
    const RatioPlan& rp = f.ratio(layer.ratio);
    mr = &meta_.ratio.at(layer.ratio);
    if (full) {
      if (side(1) != s) DSV41RT_CU(cudaStreamWaitEvent(s, st_->comp.get(), 0));
      workspaces_.note_source_write(layer.index);
    }
    comp_rows = rp.comp_rows;
    const kc::PagedRows src = paged(layer.kv_source, false, f);
    comp = static_cast<const float*>(workspaces_.acquire(
        layer.ratio, layer.kv_source, comp_rows, D * int64_t(sizeof(float)),
        [&](void* dst, int64_t) {
          DSV41RT_CU(kc::unpack_paged(kv_fmt_, src, D, f.items, rp.max_count, mr->count,
                                      mr->comp_offset, static_cast<float*>(dst), s));
        }));
  }
  if ((selects || comm_) && side(2) != s) DSV41RT_CU(cudaStreamWaitEvent(s, st_->idx.get(), 0));
  st_->store.link(side(0), s);
  const int64_t KI = layer.ratio > 0 ? c.index_topk : 0;
  if (NQ == 0) return;  // a CP rank without query rows: the state writes above were its part
  if (KI > 0) {
    DSV41RT_CHECK(topk_source_ == layer.topk_source, "layer ", layer.index,
                  " expects the top-k of layer ", layer.topk_source, ", found ", topk_source_);
  }
  // Attention of the query rows over the keys of every row.
  int32_t* idx = idx_.ensure(NQ * (W + KI), generation_);
  DSV41RT_CU(kc::attention_indices(NQ, W, KI, meta_.q_row_item, meta_.q_positions,
                                   meta_.window_first, meta_.length, meta_.old_offset, meta_.row0,
                                   f.old_rows, KI ? topk_.get() : nullptr,
                                   mr ? mr->comp_offset : nullptr, f.old_rows + N, idx, s));
  float* o = o_.ensure(NQ * nh * D, generation_);
  DSV41RT_CU(kc::sparse_attention_split(q, kv_a, f.old_rows + N, comp, comp_rows, idx, w.attn_sink,
                                        NQ, nh, D, W + KI, float(1.0 / std::sqrt(double(D))), o,
                                        s));
  DSV41RT_CU(kc::apply_rope(o, NQ, nh, D, R, meta_.q_positions, w.inv_freq, true, s));
  const int64_t g = c.o_groups, kg = nh * D / g, ro = c.o_lora_rank;
  float* z = z_.ensure(NQ * g * ro, generation_);
  DSV41RT_CU(grouped_lin(o, w.wo_a, NQ, g, kg, ro, z, s));
  DSV41RT_CU(lin(z, w.wo_b, NQ, g * ro, H, yv_.get(), false, s));
  if (options_.record_decisions && selects) {
    std::vector<int32_t> host(NQ * KI);
    DSV41RT_CU(cudaMemcpyAsync(host.data(), topk_.get(), host.size() * sizeof(int32_t),
                               cudaMemcpyDeviceToHost, s));
    DSV41RT_CU(cudaStreamSynchronize(s));
    append_sorted_rows(host.data(), NQ, KI, decisions_["topk_L" + std::to_string(layer.index)]);
  }
}

}  // namespace cuda_detail
}  // namespace dsv41rt::model
