#include "runtime/model/draft_runner.h"

#include <algorithm>
#include <cmath>

#include "core/status.h"

namespace dsv41rt::model {

DraftRunner::DraftRunner(const ModelPlan& plan, Backend& backend, const BackendWeights& weights,
                         kernels::RowFormat window)
    : plan_(plan), be_(backend), w_(weights), window_(window), alloc_([&backend](int64_t bytes) {
        return backend.alloc(bytes);
      }) {
  const ModelConfig& c = plan.config;
  DSV41RT_CHECK_CODE(kUnsupported, c.dspark.has_value() && !plan.draft_layers.empty(), c.source,
                     ": the config has no DSpark drafter");
  DSV41RT_CHECK_CODE(kInvalidArgument, weights.drafts.size() == plan.draft_layers.size(),
                     "the DSpark drafter needs weights loaded with their drafts (",
                     plan.draft_layers.size(), " stages, ", weights.drafts.size(), " mapped)");
  block_ = c.dspark->block_size;
}

void DraftRunner::check(const DraftInputs& in) const {
  const ModelConfig& c = plan_.config;
  const int64_t T = int64_t(c.dspark->target_layer_ids.size()), H = c.hidden_size;
  DSV41RT_CHECK_CODE(kInvalidArgument, in.context >= 0 && (in.features || in.context == 0),
                     "draft: features must hold context >= 0 rows, got ", in.context);
  DSV41RT_CHECK_CODE(kInvalidArgument, in.width == T * H, "draft: features have ", in.width,
                     " columns, expected ", T * H, " (", T, " target layers x hidden ", H, ")");
  const int64_t ring_first = std::max<int64_t>(0, in.anchor - c.sliding_window);
  DSV41RT_CHECK_CODE(kInvalidArgument,
                     in.first >= 0 && in.anchor >= 0 && ring_first >= in.first &&
                         in.anchor <= in.first + in.context,
                     "draft: anchor ", in.anchor, " reads the features of positions [", ring_first,
                     ", ", in.anchor, "), the rows hold [", in.first, ", ", in.first + in.context,
                     ")");
  auto tokens = [&](const std::vector<int32_t>& t, const char* what) {
    DSV41RT_CHECK_CODE(kInvalidArgument, int64_t(t.size()) == block_, "draft: ", what, " has ",
                       t.size(), " tokens, expected the block size ", block_);
    for (size_t i = 0; i < t.size(); ++i) {
      DSV41RT_CHECK_CODE(kInvalidArgument, t[i] >= 0 && t[i] < c.vocab_size, "draft: ", what, "[",
                         i, "] = ", t[i], " is outside the vocabulary [0, ", c.vocab_size, ")");
    }
  };
  tokens(in.ids, "ids");
  tokens(in.previous, "previous");
}

void DraftRunner::upload(const DraftInputs& in, int64_t ring_first, int64_t ring) {
  const int64_t hc = plan_.config.hc_mult, B = block_, K = ring + B;
  const Stream s = be_.stream(0);
  // Host staging lives until the synchronisation at the end of upload().
  std::vector<int64_t> pos(size_t(ring + B));
  for (int64_t i = 0; i < ring + B; ++i)
    pos[size_t(i)] = i < ring ? ring_first + i : in.anchor + i - ring;
  std::vector<int32_t> idx(size_t(B * K));
  for (int64_t r = 0; r < B; ++r) {
    for (int64_t j = 0; j < K; ++j) idx[size_t(r * K + j)] = int32_t(j);
  }
  std::vector<float> pre(size_t(B * hc), 0.0f);
  for (int64_t r = 0; r < B; ++r) pre[size_t(r * hc)] = 1.0f;
  be_.to_device(buf(positions_, ring + B), pos.data(), (ring + B) * int64_t(sizeof(int64_t)), s);
  be_.to_device(buf(key_idx_, B * K), idx.data(), B * K * int64_t(sizeof(int32_t)), s);
  be_.to_device(buf(pre_, B * hc), pre.data(), B * hc * int64_t(sizeof(float)), s);
  be_.to_device(buf(ids_, B), in.ids.data(), B * int64_t(sizeof(int32_t)), s);
  be_.to_device(buf(previous_, B), in.previous.data(), B * int64_t(sizeof(int32_t)), s);
  be_.to_device(buf(features_, ring * in.width), in.features + (ring_first - in.first) * in.width,
                ring * in.width * int64_t(sizeof(float)), s);
  be_.synchronize(s);
}

DraftOutputs DraftRunner::run(const DraftInputs& in) {
  DraftOutputs out;
  backbone(in, out);
  head_logits();
  add_markov(0, block_);
  finish(out);
  return out;
}

DraftOutputs DraftRunner::run_greedy(const DraftInputs& in) {
  DraftOutputs out;
  backbone(in, out);
  head_logits();
  const int64_t V = plan_.config.vocab_size;
  const Stream s = be_.stream(0);
  std::vector<float> row(static_cast<size_t>(V));
  int32_t prev = in.previous[0];
  for (int64_t i = 0; i < block_; ++i) {
    be_.to_device(previous_.get() + i, &prev, int64_t(sizeof(int32_t)), s);
    add_markov(i, 1);
    be_.to_host(row.data(), logits_.get() + i * V, V * int64_t(sizeof(float)), s);
    be_.synchronize(s);
    prev = int32_t(std::max_element(row.begin(), row.end()) - row.begin());
    out.tokens.push_back(prev);
  }
  finish(out);
  return out;
}

void DraftRunner::backbone(const DraftInputs& in, DraftOutputs& out) {
  check(in);
  const ModelConfig& c = plan_.config;
  const int64_t H = c.hidden_size, hc = c.hc_mult, B = block_;
  const float eps = float(c.rms_norm_eps);
  const Stream s = be_.stream(0);
  const int64_t ring_first = std::max<int64_t>(0, in.anchor - c.sliding_window);
  const int64_t ring = in.anchor - ring_first;
  upload(in, ring_first, ring);

  // The target side, once for every stage (NeMo: stage 0 projects, the others reuse it).
  float* main_x = buf(main_x_, ring * H);
  if (ring > 0) {
    be_.linear(features_.get(), w_.draft_heads.main_proj, ring, in.width, H, main_x, false, s);
    be_.rms_norm(main_x, w_.draft_heads.main_norm, ring, H, eps, main_x, s);
  }
  be_.embed_rows(w_.embed, w_.embed_bf16, ids_.get(), B, H, hc, buf(X_, B * hc * H), s);
  for (size_t i = 0; i < plan_.draft_layers.size(); ++i) {
    stage(plan_.draft_layers[i], w_.drafts[i], ring, out);
  }
}

// One stage as a backbone block: attention of the block rows, then the draft MoE; the pre-mix
// that collapses the next stage's input is this stage's FFN pre-mix (left in pre_).
void DraftRunner::stage(const LayerPlan& layer, const LayerWeights& w, int64_t ring,
                        DraftOutputs& out) {
  const ModelConfig& c = plan_.config;
  const int64_t H = c.hidden_size, hc = c.hc_mult, B = block_, E = layer.n_experts;
  const int64_t k = layer.experts_per_tok;
  const float eps = float(c.rms_norm_eps), hc_eps = float(c.hc_eps);
  const Stream s = be_.stream(0);
  float* X = X_.get();
  float* X1 = buf(X1_, B * hc * H);
  float* u = buf(u_, B * H);
  float* xn = buf(xn_, B * H);
  float* a_pre = buf(a_pre_, B * hc);
  float* a_post = buf(a_post_, B * hc);
  float* a_comb = buf(a_comb_, B * hc * hc);
  float* f_pre = buf(f_pre_, B * hc);
  float* f_post = buf(f_post_, B * hc);
  float* f_comb = buf(f_comb_, B * hc * hc);
  float* y = buf(y_, B * H);

  be_.hc_mix(X, w.hc_attn_fn, w.hc_attn_base, w.hc_attn_scale, B, hc, H, eps, hc_eps,
             c.hc_sinkhorn_iters, a_pre, a_post, a_comb, scratch(mix_scratch_), s);
  be_.hc_collapse(X, pre_.get(), B, hc, H, u, s);
  be_.rms_norm(u, w.attn_norm, B, H, eps, xn, s);
  attention(w, ring, out);
  be_.hc_expand(X, y, a_post, a_comb, B, hc, H, X1, s);
  be_.hc_mix(X1, w.hc_ffn_fn, w.hc_ffn_base, w.hc_ffn_scale, B, hc, H, eps, hc_eps,
             c.hc_sinkhorn_iters, f_pre, f_post, f_comb, scratch(mix_scratch_), s);
  be_.hc_collapse(X1, a_pre, B, hc, H, u, s);
  be_.rms_norm(u, w.ffn_norm, B, H, eps, xn, s);
  int32_t* midx = buf(moe_idx_, B * k);
  float* mw = buf(moe_w_, B * k);
  be_.moe_route(xn, w.gate, w.bias, B, H, E, k, float(c.routed_scaling_factor), c.norm_topk_prob,
                midx, mw, s);
  be_.moe_experts(xn, midx, mw, B, H, k, E, c.moe_intermediate_size, w, float(c.swiglu_limit), y,
                  scratch(moe_scratch_), s);
  be_.hc_expand(X1, y, f_post, f_comb, B, hc, H, X, s);
  be_.copy(pre_.get(), f_pre, B * hc * int64_t(sizeof(float)), s);
}

// Queries of the block rows over [ring keys | block keys]; output into y_ (see the header).
void DraftRunner::attention(const LayerWeights& w, int64_t ring, DraftOutputs& out) {
  const ModelConfig& c = plan_.config;
  const int64_t H = c.hidden_size, D = c.head_dim, nh = c.num_attention_heads, B = block_;
  const int64_t R = c.qk_rope_head_dim, K = ring + B, ql = c.q_lora_rank;
  const float eps = float(c.rms_norm_eps);
  const Stream s = be_.stream(0);
  const int64_t* pos_all = positions_.get();
  const int64_t* pos_block = pos_all + ring;
  float* qr = buf(qr_, B * ql);
  float* q = buf(q_, B * nh * D);
  be_.linear(xn_.get(), w.wq_a, B, H, ql, qr, false, s);
  be_.rms_norm(qr, w.q_norm, B, ql, eps, qr, s);
  be_.linear(qr, w.wq_b, B, ql, nh * D, q, false, s);
  be_.apply_rope(q, B, nh, D, R, pos_block, w.inv_freq, false, s);

  float* kv = buf(kv_, K * D);
  if (ring > 0) be_.linear(main_x_.get(), w.wkv, ring, H, D, kv, false, s);
  be_.linear(xn_.get(), w.wkv, B, H, D, kv + ring * D, false, s);
  be_.rms_norm(kv, w.kv_norm, K, D, eps, kv, s);
  be_.apply_rope(kv, K, 1, D, R, pos_all, w.inv_freq, false, s);
  if (record_window_kv) {
    std::vector<float>& rec = out.window_kv.emplace_back(size_t(K * D));
    be_.to_host(rec.data(), kv, K * D * int64_t(sizeof(float)), s);
    be_.synchronize(s);
  }
  be_.cache_qdq(window_, kv, K, D, s);

  float* o = buf(o_, B * nh * D);
  const float scale = float(1.0 / std::sqrt(double(D)));
  const bool keys_bf16 = window_ != kernels::RowFormat::kF32;  // QDQ'd rows are BF16 values
  be_.sparse_attention(q, kv, ring, kv + ring * D, B, key_idx_.get(), w.attn_sink, B, nh, D, K,
                       scale, keys_bf16, o, s);
  be_.apply_rope(o, B, nh, D, R, pos_block, w.inv_freq, true, s);
  const int64_t ro = c.o_lora_rank, kg = nh * D / c.o_groups;
  float* z = buf(z_, B * c.o_groups * ro);
  be_.grouped_linear(o, w.wo_a, B, c.o_groups, kg, ro, z, s);
  be_.linear(z, w.wo_b, B, c.o_groups * ro, H, y_.get(), false, s);
}

// Final collapse and norm, the shared head plus the Markov head, the confidence head on
// [normed | markov embedding] (NeMo-trained drafts feed the normed state).
void DraftRunner::head_logits() {
  const ModelConfig& c = plan_.config;
  const int64_t H = c.hidden_size, hc = c.hc_mult, B = block_, V = c.vocab_size;
  const Stream s = be_.stream(0);
  float* normed = buf(normed_, B * H);
  be_.hc_collapse(X_.get(), pre_.get(), B, hc, H, normed, s);
  be_.rms_norm(normed, w_.draft_heads.norm, B, H, float(c.rms_norm_eps), normed, s);
  be_.linear(normed, w_.head, B, H, V, buf(logits_, B * V), false, s);
}

// Rows are independent in every op here (fixed reduction order), so adding the Markov head row
// by row gives the bits of adding it to the whole block at once.
void DraftRunner::add_markov(int64_t row0, int64_t n) {
  const ModelConfig& c = plan_.config;
  const int64_t V = c.vocab_size, r = c.dspark->markov_rank;
  const DraftHeadWeights& h = w_.draft_heads;
  const Stream s = be_.stream(0);
  float* markov = buf(markov_, block_ * r) + row0 * r;
  be_.embed_rows(h.markov_embed, nullptr, previous_.get() + row0, n, r, 1, markov, s);
  be_.linear(markov, h.markov_head, n, r, V, logits_.get() + row0 * V, true, s);
}

void DraftRunner::finish(DraftOutputs& out) {
  const ModelConfig& c = plan_.config;
  const int64_t H = c.hidden_size, B = block_, V = c.vocab_size;
  const int64_t r = c.dspark->markov_rank;
  const DraftHeadWeights& h = w_.draft_heads;
  const Stream s = be_.stream(0);
  const float* normed = normed_.get();
  const float* markov = markov_.get();
  const float* logits = logits_.get();
  float* joined = buf(joined_, B * (H + r));
  const int64_t f = int64_t(sizeof(float));
  be_.copy_2d(joined, (H + r) * f, normed, H * f, H * f, B, s);
  be_.copy_2d(joined + H, (H + r) * f, markov, r * f, r * f, B, s);
  float* conf = buf(conf_, B);
  be_.linear(joined, h.confidence, B, H + r, 1, conf, false, s);

  out.block = B, out.vocab = V;
  out.logits.resize(size_t(B * V));
  out.confidence.resize(size_t(B));
  be_.to_host(out.logits.data(), logits, B * V * f, s);
  be_.to_host(out.confidence.data(), conf, B * f, s);
  be_.synchronize(s);
}

}  // namespace dsv41rt::model
