// DeepSeek-V4's MTP layer (spec 4.3; NeMo's DeepseekV4MTPBlock, v4:mtp.py:45-192) on the final
// streams of the forward run() just computed, before the hyper-head's collapse:
//
//   E  = e_proj(enorm(embed(x_{t+1})))          [rows, H]
//   Hs = h_proj(hnorm(X_t))                     per stream, [rows, hc, H]
//   X  = Hs + E                                 E on every stream
//   X  = block(mtp.s, X)                        the backbone's block code (ModelRunner::block):
//                                               m = 0 attention over the layer's own window
//                                               ring, score-routed MoE, per-sublayer mHC
//   logits = head(norm(collapse(X, hc_head_pre_mtp(X))))
//
// The embedding and the head are the backbone's; the rest is the layer's (draft_heads). The
// layer's ring is slot ring plan.layers.size() + s (StateLayout), written as the backbone's
// rings are, so decode steps continue it.
#include <vector>

#include "core/status.h"
#include "runtime/model/model_runner.h"

namespace dsv41rt::model {

void ModelRunner::run_mtp(const ForwardPlan& f, const std::vector<int32_t>& next, int stage) {
  const ModelConfig& c = plan_.config;
  const DraftHeadWeights& h = w_.draft_heads;
  DSV41RT_CHECK_CODE(
      kUnsupported,
      !c.is_v41() && !c.dspark && stage >= 0 && size_t(stage) < w_.drafts.size() && h.e_proj,
      "run_mtp: the weights hold no V4 MTP layer ", stage,
      " (V4 checkpoints with num_nextn_predict_layers > 0, loaded with their drafts)");
  DSV41RT_CHECK_CODE(kUnsupported, meta_.nq == f.rows && tp() == 1,
                     "run_mtp: the MTP layer runs on one rank (no context or tensor parallelism)");
  const int64_t H = c.hidden_size, hc = c.hc_mult, N = f.rows, V = c.vocab_size;
  DSV41RT_CHECK_CODE(kInvalidArgument, int64_t(next.size()) == N, "run_mtp: ", next.size(),
                     " next tokens for a forward of ", N, " rows");
  for (size_t r = 0; r < next.size(); ++r) {
    DSV41RT_CHECK_CODE(kInvalidArgument, next[r] >= 0 && next[r] < V, "run_mtp: next token ",
                       next[r], " of row ", r, " is outside the vocabulary [0, ", V, ")");
  }
  if (N == 0) return;
  const float eps = float(c.rms_norm_eps), hc_eps = float(c.hc_eps);
  const Stream s = main();
  LayerPlan layer = plan_.draft_layers[size_t(stage)];
  layer.index = int(plan_.layers.size()) + stage;  // its ring (and its key in Decisions)
  const LayerWeights& w = w_.drafts[size_t(stage)];
  if (record_decisions) {
    std::vector<float>& dst = decisions_.mtp_streams[stage];
    dst.resize(size_t(N * hc * H));
    be_.to_host(dst.data(), X_.get(), N * hc * H * int64_t(sizeof(float)), s);
    be_.synchronize(s);
    decisions_.mtp_streams_width = hc * H;
  }

  int32_t* ids = buf(mtp_next_, N);
  be_.to_device(ids, next.data(), N * int64_t(sizeof(int32_t)), s);
  float* e = buf(mtp_e_, 2 * N * H);
  float* E = e + N * H;
  be_.embed_rows(w_.embed, w_.embed_bf16, ids, N, H, 1, e, s);
  be_.rms_norm(e, h.enorm, N, H, eps, e, s);
  be_.linear(e, h.e_proj, N, H, H, E, false, s);

  float* Xs = X1_.get();  // the MTP layer's streams
  float* Xt = buf(mtp_X_, N * hc * H);
  be_.rms_norm(X_.get(), h.hnorm, N * hc, H, eps, Xs, s);
  be_.linear(Xs, h.h_proj, N * hc, H, H, Xt, false, s);
  // Hs + E on every stream as hc_expand with post 1 and comb the identity: 1 · E and the
  // 0 · Hs_j terms are exact, so each element is the one rounding of E + Hs_i.
  std::vector<float> ones(size_t(N * hc), 1.0f), eye(size_t(N * hc * hc), 0.0f);
  for (int64_t r = 0; r < N; ++r) {
    for (int64_t i = 0; i < hc; ++i) eye[size_t((r * hc + i) * hc + i)] = 1.0f;
  }
  float* post = buf(mtp_ones_, N * hc);
  float* comb = buf(mtp_eye_, N * hc * hc);
  be_.to_device(post, ones.data(), N * hc * int64_t(sizeof(float)), s);
  be_.to_device(comb, eye.data(), N * hc * hc * int64_t(sizeof(float)), s);
  be_.hc_expand(Xt, E, post, comb, N, hc, H, Xs, s);

  block(layer, w, f, Xs, Xt, pre_.get(), f_pre_.get());

  float* pre = pre_.get();
  float* u = u_.get();
  be_.hc_head_pre(Xs, h.hc_head_fn, h.hc_head_base, h.hc_head_scale, N, hc, H, eps, hc_eps, pre, s);
  be_.hc_collapse(Xs, pre, N, hc, H, u, s);
  be_.rms_norm(u, h.norm, N, H, eps, u, s);
  float* logits = buf(mtp_logits_, N * V);
  be_.linear(u, w_.head, N, H, V, logits, false, s);
  if (record_decisions) {
    std::vector<float>& dst = decisions_.mtp_logits[stage];
    dst.resize(size_t(N * V));
    be_.to_host(dst.data(), logits, N * V * int64_t(sizeof(float)), s);
    be_.synchronize(s);
    decisions_.mtp_logits_width = V;
  }
}

}  // namespace dsv41rt::model
