#include "runtime/model/model_runner.h"

#include <algorithm>

#include "core/status.h"

namespace dsv41rt::model {

namespace {

// Timing marker ids: 0 and 1 bracket a forward (the executor's); CP marks follow.
constexpr int kCpTimingBase = 2;

}  // namespace

ModelRunner::ModelRunner(const ModelPlan& plan, Backend& backend, const BackendWeights& weights,
                         const StateLayout& layout, KvPool& pool, DequantWorkspaces& workspaces)
    : plan_(plan),
      be_(backend),
      w_(weights),
      layout_(layout),
      pool_(pool),
      workspaces_(workspaces),
      alloc_([&backend](int64_t bytes) { return backend.alloc(bytes); }),
      collectives_(backend) {}

void ModelRunner::reset_forward_state() {
  topk_source_ = -1;
  candidates_ratio_ = -1;
  cp_layer_ = 0;
}

void ModelRunner::begin(const ForwardPlan& f, comm::Communicator* comm) {
  workspaces_.begin_forward();
  reset_forward_state();
  comm_ = comm;
  if (comm) qv_ = query_rows(f, comm->rank(), comm->size());
  decisions_ = {};
  decisions_.rows = comm ? qv_.rows : f.rows;
  meta_ = uploader_.upload(be_, f, plan_.config.hc_mult, comm ? &qv_ : nullptr,
                           comm ? comm->size() : 1, main(), generation_);
}

void ModelRunner::run(const ForwardPlan& f) {
  embed_and_layers(f);
  comm_ = nullptr;
}

void ModelRunner::embed_and_layers(const ForwardPlan& f) {
  const ModelConfig& c = plan_.config;
  // The streams carry the query rows (this rank's under context parallelism, else all rows);
  // xn and u are sized for the all-gather's per-rank count.
  const int64_t H = c.hidden_size, hc = c.hc_mult, N = meta_.nq;
  const int64_t NA = comm_ ? qv_.max_local : N;
  const float eps = float(c.rms_norm_eps), hc_eps = float(c.hc_eps);
  const bool v4 = !c.is_v41();
  const Stream s = main();
  float* X = buf(X_, N * hc * H);
  float* X1 = buf(X1_, N * hc * H);
  float* u = buf(u_, NA * H);
  buf(xn_, NA * H);
  buf(yv_, N * H);
  float* pre = buf(pre_, N * hc);
  buf(a_pre_, N * hc);
  buf(a_post_, N * hc);
  buf(a_comb_, N * hc * hc);
  float* f_pre = buf(f_pre_, N * hc);
  buf(f_post_, N * hc);
  buf(f_comb_, N * hc * hc);

  // A CP rank may own no rows of a short batch: it still takes part in the all-gathers and
  // writes every row's state (attention), and skips the row-wise ops.
  const bool rows_here = N > 0;
  if (rows_here) {
    be_.embed_rows(w_.embed, w_.embed_bf16, meta_.q_tokens, N, H, hc, X, s);
    be_.copy(pre, meta_.pre0, N * hc * int64_t(sizeof(float)), s);
  }
  int engram_pos = 0;
  for (size_t li = 0; li < plan_.layers.size(); ++li) {
    const LayerPlan& layer = plan_.layers[li];
    const LayerWeights& w = w_.layers[li];
    if (layer.engram && rows_here) {
      const EngramSpec& e = *c.engram;
      const int64_t cols = int64_t(e.max_ngram_size - 1) * e.n_heads, hd = e.head_dim;
      float* emb = buf(emb_, N * cols * hd);
      be_.engram_gather(w.engram_table, w.engram_scale, meta_.q_engram_rows[engram_pos], N * cols,
                        hd, emb, s);
      be_.engram_forward(X, emb, w.engram_wkv, w.engram_q, w.engram_k, N, hc, H, cols * hd, eps,
                         scratch(engram_scratch_), s);
    }
    if (layer.engram) ++engram_pos;
    if ((record_decisions || capture_dspark_features) && rows_here && dspark_target(layer.index)) {
      record_dspark_features(layer.index, X, N, hc, H);
    }
    block(layer, w, f, X, X1, pre, f_pre);
    std::swap(pre, f_pre);
  }
  if (rows_here && v4) {  // the hyper-head's own collapse weights
    be_.hc_head_pre(X, w_.hc_head_fn, w_.hc_head_base, w_.hc_head_scale, N, hc, H, eps, hc_eps, pre,
                    s);
  }
  if (rows_here) be_.hc_collapse(X, pre, N, hc, H, u, s);
  const float* u_all = u;
  if (comm_) {  // every rank gathers the final hidden states (a collective: all take part)
    float* ug = buf(ug_, f.rows * H);
    gather_rows(u, H, f.rows, ug, s);
    u_all = ug;
  }
  head_and_sample(f, u_all);
}

// One block on the streams X (X1: the streams between the sublayers): mHC mix -> collapse ->
// attention -> expand -> mix -> collapse -> MoE -> expand, back into X. `pre` is V4.1's collapse
// weights from the previous sublayer's mix; `f_pre` receives the FFN mix's pre. The buffers
// embed_and_layers sized are reused (the MTP layer runs on the same rows).
void ModelRunner::block(const LayerPlan& layer, const LayerWeights& w, const ForwardPlan& f,
                        float* X, float* X1, const float* pre, float* f_pre) {
  const ModelConfig& c = plan_.config;
  const int64_t H = c.hidden_size, hc = c.hc_mult, N = meta_.nq;
  const float eps = float(c.rms_norm_eps), hc_eps = float(c.hc_eps);
  const bool v4 = !c.is_v41();
  const Stream s = main();
  float *u = u_.get(), *xn = xn_.get(), *a_pre = a_pre_.get(), *a_post = a_post_.get();
  float *a_comb = a_comb_.get(), *f_post = f_post_.get(), *f_comb = f_comb_.get();
  const bool rows_here = N > 0;
  const Stream ms = mix_stream(v4);
  if (rows_here) {
    mix_forked(ms);
    be_.hc_mix(X, w.hc_attn_fn, w.hc_attn_base, w.hc_attn_scale, N, hc, H, eps, hc_eps,
               c.hc_sinkhorn_iters, a_pre, a_post, a_comb, scratch(mix_scratch_), ms);
    // V4 collapses each sublayer's streams with the pre of their own mix; V4.1 with the pre
    // the previous sublayer's mix computed (single-pass mHC), beside this mix.
    be_.hc_collapse(X, v4 ? a_pre : pre, N, hc, H, u, s);
    be_.rms_norm(u, w.attn_norm, N, H, eps, xn, s);
  }
  attention(layer, w, f);
  if (rows_here) {
    mix_joined(ms);
    be_.hc_expand(X, yv_.get(), a_post, a_comb, N, hc, H, X1, s);
    mix_forked(ms);
    be_.hc_mix(X1, w.hc_ffn_fn, w.hc_ffn_base, w.hc_ffn_scale, N, hc, H, eps, hc_eps,
               c.hc_sinkhorn_iters, f_pre, f_post, f_comb, scratch(mix_scratch_), ms);
    be_.hc_collapse(X1, v4 ? f_pre : a_pre, N, hc, H, u, s);
    be_.rms_norm(u, w.ffn_norm, N, H, eps, xn, s);
    ffn(layer, w, X1, X, f_post, f_comb, ms);
  }
}

// MoE (spec §5): route, routed + shared experts, then the stream expansion.
void ModelRunner::ffn(const LayerPlan& layer, const LayerWeights& w, float* X1, float* X,
                      const float* f_post, const float* f_comb, Stream mix) {
  const ModelConfig& c = plan_.config;
  const int64_t H = c.hidden_size, N = meta_.nq, E = layer.n_experts, k = layer.experts_per_tok;
  const Stream s = main();
  int32_t* midx = buf(moe_idx_, N * k);
  float* mw = buf(moe_w_, N * k);
  if (layer.hash_routed) {  // V4's first layers: experts by token id (tid2eid)
    be_.moe_route_hash(xn_.get(), w.gate, w.tid2eid, meta_.q_tokens, N, H, E, k, c.vocab_size,
                       float(c.routed_scaling_factor), midx, mw, s);
  } else {
    be_.moe_route(xn_.get(), w.gate, w.bias, N, H, E, k, float(c.routed_scaling_factor),
                  c.norm_topk_prob, midx, mw, s);
  }
  const int64_t I = c.moe_intermediate_size;
  const float limit = float(c.swiglu_limit);
  if (expert_comm && expert_comm->size() > 1 &&
      be_.expert_split() == Backend::ExpertSplit::kSlots) {
    // Each rank computes the (token, slot) outputs of its experts; their sum over the ranks has
    // exactly one non-zero term per slot (exact), and the combine adds them in moe_experts'
    // order, so the result is bitwise the one-rank one.
    float* slots = buf(moe_slots_, N * k * H);
    be_.moe_expert_slots(xn_.get(), midx, mw, N, H, k, E, I, w, limit, slots, scratch(moe_scratch_),
                         s);
    collectives_.all_reduce_sum(*expert_comm, slots, N * k * H, s);
    be_.moe_combine(xn_.get(), midx, slots, N, H, k, I, w, limit, yv_.get(), scratch(moe_scratch_),
                    s);
  } else if (expert_comm && expert_comm->size() > 1) {
    // Each rank: its experts' outputs for the slots routed to them (the other ids fall outside
    // its stack and are skipped), rank 0 adding the shared expert; the ranks' sum is the block's.
    int32_t* local = buf(moe_local_idx_, N * k);
    be_.moe_local_ids(midx, N * k, w.expert_begin, w.expert_count, local, s);
    // Without the shared expert the MoE's numerics stay the same (checked at load).
    LayerWeights mine = w;
    if (expert_comm->rank() != 0) mine.shared_w1 = mine.shared_w3 = mine.shared_w2 = Matrix{};
    be_.moe_experts(xn_.get(), local, mw, N, H, k, w.expert_count, I, mine, limit, yv_.get(),
                    scratch(moe_scratch_), s);
    collectives_.all_reduce_sum(*expert_comm, yv_.get(), N * H, s);
  } else {
    be_.moe_experts(xn_.get(), midx, mw, N, H, k, E, I, w, limit, yv_.get(), scratch(moe_scratch_),
                    s);
  }
  if (record_decisions) {
    record(decisions_.experts, decisions_.experts_width, layer.index, midx, N, k);
  }
  mix_joined(mix);  // f_post, f_comb
  be_.hc_expand(X1, yv_.get(), f_post, f_comb, N, c.hc_mult, H, X, s);
}

// The head over the plan's head rows, then the tokens of the sampling rows.
void ModelRunner::head_and_sample(const ForwardPlan& f, const float* u) {
  const ModelConfig& c = plan_.config;
  const int64_t H = c.hidden_size, V = c.vocab_size, rows = int64_t(f.head_rows.size());
  const Stream s = main();
  if (rows == 0) return;
  float* hsel = buf(hsel_, rows * H);
  float* logits = buf(logits_, rows * V);
  be_.gather_rows(u, meta_.head_rows, rows, H, hsel, s);
  be_.rms_norm(hsel, w_.norm, rows, H, float(c.rms_norm_eps), hsel, s);
  if (tp() > 1) {  // vocabulary-parallel head: each rank's columns, gathered
    float* local = buf(tp_local_, rows * (V / tp()));
    be_.linear(hsel, w_.head, rows, H, V / tp(), local, false, s);
    gather_columns(local, rows, V / tp(), logits, s);
  } else {
    be_.linear(hsel, w_.head, rows, H, V, logits, false, s);
  }
  const SamplePlan& sp = f.sample;
  const int64_t n = sp.rows();
  if (n == 0) return;
  const int32_t top = sp.max_top;
  if (!sp.mask_logit_row.empty()) {
    be_.mask_tokens(logits, meta_.mask_logit_row, int64_t(sp.mask_logit_row.size()), V,
                    meta_.mask_words, s);
  }
  be_.sample(logits, meta_.sample_logit_row, n, V, meta_.sample_params, meta_.history,
             meta_.prompt_off, meta_.output_off, meta_.sample_steps, buf(tokens_, n),
             buf(logprobs_, n), top, top > 0 ? buf(top_ids_, n * top) : nullptr,
             top > 0 ? buf(top_lps_, n * top) : nullptr, scratch(sample_scratch_), s);
}

// Sorted rows: the selections compare as sets.
void ModelRunner::record(std::map<int, std::vector<int32_t>>& into, std::map<int, int64_t>& width,
                         int layer, const int32_t* values, int64_t rows, int64_t k) {
  std::vector<int32_t> host(size_t(rows * k));
  be_.to_host(host.data(), values, rows * k * int64_t(sizeof(int32_t)), main());
  be_.synchronize(main());
  for (int64_t r = 0; r < rows; ++r) std::sort(host.begin() + r * k, host.begin() + (r + 1) * k);
  std::vector<int32_t>& dst = into[layer];
  dst.insert(dst.end(), host.begin(), host.end());
  width[layer] = k;
}

void ModelRunner::gather_columns(const float* local, int64_t rows, int64_t cols, float* out,
                                 Stream s) {
  const int64_t P = tensor_comm->size();
  float* recv = buf(tp_recv_, P * rows * cols);
  collectives_.all_gather(*tensor_comm, local, recv, rows * cols, s);
  // Rank r's block [rows, cols] becomes columns r * cols .. of out [rows, P * cols].
  const int64_t bytes = cols * int64_t(sizeof(float));
  for (int64_t r = 0; r < P; ++r) {
    be_.copy_2d(out + r * cols, P * bytes, recv + r * rows * cols, bytes, bytes, rows, s);
  }
}

void ModelRunner::record_window_kv(int layer, const float* kv, int64_t rows, int64_t dim) {
  std::vector<float>& dst = decisions_.window_kv[layer];
  const size_t at = dst.size();
  dst.resize(at + size_t(rows * dim));
  be_.to_host(dst.data() + at, kv, rows * dim * int64_t(sizeof(float)), main());
  be_.synchronize(main());
  decisions_.window_kv_width = dim;
}

bool ModelRunner::dspark_target(int layer) const {
  const std::optional<DSparkSpec>& d = plan_.config.dspark;
  return d && std::find(d->target_layer_ids.begin(), d->target_layer_ids.end(), layer) !=
                  d->target_layer_ids.end();
}

// Mean over the streams in the reference's order: ((x_0 + x_1) + x_2) + ..., then / hc.
void ModelRunner::record_dspark_features(int layer, const float* X, int64_t rows, int64_t hc,
                                         int64_t H) {
  std::vector<float> streams(size_t(rows * hc * H));
  be_.to_host(streams.data(), X, rows * hc * H * int64_t(sizeof(float)), main());
  be_.synchronize(main());
  std::vector<float>& dst = decisions_.dspark_features[layer];
  const size_t at = dst.size();
  dst.resize(at + size_t(rows * H));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < H; ++i) {
      float sum = 0.0f;
      for (int64_t j = 0; j < hc; ++j) sum += streams[size_t((r * hc + j) * H + i)];
      dst[at + size_t(r * H + i)] = sum / float(hc);
    }
  }
  decisions_.hidden = H;
}

void ModelRunner::gather_rows(const float* local, int64_t dim, int64_t rows, float* out, Stream s) {
  const int64_t P = comm_->size(), count = qv_.max_local * dim;
  float* recv = buf(cp_recv_, P * count);
  collectives_.all_gather(*comm_, local, recv, count, s);
  be_.gather_rows(recv, meta_.cp_src_row, rows, dim, out, s);
}

void ModelRunner::cp_mark(int i, Stream s) {
  if (!cp_timing) return;
  be_.record_time(kCpTimingBase + int(cp_layer_) * 4 + i, s);
  if (i == 3) ++cp_layer_;
}

CpTiming ModelRunner::read_cp_timing() {
  CpTiming t;
  t.layers = cp_layer_;
  auto at = [&](int64_t l, int i) {
    return be_.elapsed_ms(0, kCpTimingBase + int(l) * 4 + i) * 1000.0;
  };
  for (int64_t l = 0; l < cp_layer_; ++l) {
    const double q0 = at(l, 0), q1 = at(l, 1), g0 = at(l, 2), g1 = at(l, 3);
    t.q_projection_us += int64_t(q1 - q0);
    t.all_gather_us += int64_t(g1 - g0);
    t.overlap_us += int64_t(std::max(0.0, std::min(q1, g1) - std::max(q0, g0)));
  }
  return t;
}

}  // namespace dsv41rt::model
