#include "runtime/model/executor.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/attention.h"
#include "kernels/compressor.h"
#include "kernels/engram.h"
#include "kernels/indexer.h"
#include "kernels/linear.h"
#include "kernels/mhc.h"
#include "kernels/moe.h"
#include "kernels/quant.h"
#include "kernels/rms_norm.h"
#include "kernels/rope.h"
#include "runtime/dtype.h"
#include "runtime/status.h"

namespace dsv41rt::model {

namespace k = kernels::cpu;

// Per-forward state published by one layer for the next ones (spec §2.7.2, §2.9).
struct CpuExecutor::Shared {
  std::vector<int32_t> topk;  // [n, index_topk] of the latest index source
  int topk_source = -1;
  std::vector<uint8_t> candidates;  // [n, T] of the candidate source
  int64_t candidates_width = -1;
};

namespace {

void copy_pack(const float* x, int64_t rows, int64_t dim, uint8_t* out) {
  std::memcpy(out, x, size_t(rows * dim) * sizeof(float));
}
void copy_unpack(const uint8_t* in, int64_t rows, int64_t dim, float* y) {
  std::memcpy(y, in, size_t(rows * dim) * sizeof(float));
}

RowCodec make_codec(bool quant, int64_t dim, int64_t quant_row_bytes,
                    void (*pack)(const float*, int64_t, int64_t, uint8_t*),
                    void (*unpack)(const uint8_t*, int64_t, int64_t, float*),
                    void (*qdq)(const float*, int64_t, int64_t, float*)) {
  if (!quant) return RowCodec{dim, dim * int64_t(sizeof(float)), copy_pack, copy_unpack, nullptr};
  return RowCodec{dim, quant_row_bytes, pack, unpack, qdq};
}

void sorted_copy(const int32_t* src, int64_t n, int64_t k, std::vector<int32_t>& dst) {
  dst.assign(src, src + n * k);
  for (int64_t r = 0; r < n; ++r) std::sort(dst.begin() + r * k, dst.begin() + (r + 1) * k);
}

}  // namespace

CpuExecutor::CpuExecutor(ModelPlan plan, ModelWeights weights, EngramTables engram,
                         ExecutorOptions options)
    : plan_(std::move(plan)),
      weights_(std::move(weights)),
      engram_(std::move(engram)),
      options_(options) {
  const ModelConfig& c = plan_.config;
  const bool q = options_.cache_quant;
  window_codec_ = make_codec(q, c.head_dim, k::fp8_window_row_bytes(c.head_dim), k::fp8_window_pack,
                             k::fp8_window_unpack, k::fp8_window_qdq);
  kv_codec_ = make_codec(q, c.head_dim, k::nvfp4_row_bytes(c.head_dim), k::nvfp4_pack,
                         k::nvfp4_unpack, k::nvfp4_qdq);
  key_codec_ = make_codec(q, c.index_head_dim, k::mxfp4_row_bytes(c.index_head_dim), k::mxfp4_pack,
                          k::mxfp4_unpack, k::mxfp4_qdq);
  if (c.engram) {
    DSV41RT_CHECK(engram_.layers.size() == c.engram->layer_ids.size(), c.source,
                  ": Engram tables for ", engram_.layers.size(), " layers, config has ",
                  c.engram->layer_ids.size());
    DSV41RT_CHECK(int64_t(engram_.token_map.size()) == c.vocab_size, c.source,
                  ": Engram token map has ", engram_.token_map.size(), " entries, vocab is ",
                  c.vocab_size);
  }
  for (const LayerPlan& layer : plan_.layers) {
    k::YarnParams yarn;
    const k::YarnParams* yp = nullptr;
    if (layer.yarn && c.yarn) {
      yarn.factor = c.yarn->factor;
      yarn.original_max_position = c.yarn->original_max_position;
      yarn.beta_fast = c.yarn->beta_fast;
      yarn.beta_slow = c.yarn->beta_slow;
      yp = &yarn;
    }
    inv_freq_.push_back(k::rope_inv_freq(c.qk_rope_head_dim, layer.rope_base, yp));
  }
}

RequestState CpuExecutor::new_request() const {
  const ModelConfig& c = plan_.config;
  RequestState s;
  s.window.assign(plan_.layers.size(),
                  std::vector<uint8_t>(size_t(c.sliding_window) * window_codec_.row_bytes));
  for (const LayerPlan& layer : plan_.layers) {
    if (layer.role == LayerRole::kFull) s.sources[layer.index].ratio = layer.ratio;
  }
  return s;
}

void CpuExecutor::embed(const int32_t* tokens, int64_t n, float* X) const {
  const ModelConfig& c = plan_.config;
  const int64_t H = c.hidden_size, hc = c.hc_mult;
  std::vector<float> row(H);
  for (int64_t t = 0; t < n; ++t) {
    DSV41RT_CHECK(tokens[t] >= 0 && tokens[t] < c.vocab_size, "token id ", tokens[t], " at index ",
                  t, " is outside the vocabulary [0, ", c.vocab_size, ")");
    if (weights_.embed_bf16) {
      k::dequant_bf16(weights_.embed_bf16 + int64_t(tokens[t]) * H, H, row.data());
    } else {
      std::memcpy(row.data(), weights_.embed.ptr() + int64_t(tokens[t]) * H, H * sizeof(float));
    }
    for (int64_t i = 0; i < hc; ++i)
      std::memcpy(X + (t * hc + i) * H, row.data(), H * sizeof(float));
  }
}

void CpuExecutor::engram(int layer_pos, const BlockWeights& w, const std::vector<int64_t>& cids,
                         int64_t n, float* X) const {
  const ModelConfig& c = plan_.config;
  const EngramSpec& e = *c.engram;
  const EngramTables::Layer& L = engram_.layers[layer_pos];
  const int64_t cols = int64_t(e.max_ngram_size - 1) * e.n_heads, hd = e.head_dim;
  std::vector<int64_t> rows(n * cols);
  const int64_t pad = engram_.token_map[e.pad_token_id];
  k::engram_hash_rows(cids.data(), n, e.max_ngram_size, e.n_heads, L.multipliers.data(),
                      L.primes.data(), L.offsets.data(), pad, rows.data());
  const EngramWeights& ew = *w.engram;
  std::vector<float> emb(n * cols * hd);
  for (int64_t i = 0; i < n * cols; ++i) {
    const int64_t r = rows[i];
    DSV41RT_CHECK(r >= 0 && r < ew.rows, "Engram row ", r, " outside the table (", ew.rows,
                  " rows)");
    k::dequant_fp8_blocks(ew.table + r * hd, ew.table_scale + r * (hd / 32), 1, hd, 1, 32,
                          emb.data() + i * hd);
  }
  k::engram_forward(X, emb.data(), ew.wkv.ptr(), ew.q_weight.ptr(), ew.k_weight.ptr(), nullptr, n,
                    c.hc_mult, c.hidden_size, cols * hd, float(c.rms_norm_eps));
}

void CpuExecutor::compress(const LayerPlan& layer, const AttentionWeights& w, SourceState& src,
                           const float* x, int64_t n) {
  const ModelConfig& c = plan_.config;
  const int64_t H = c.hidden_size, D = c.head_dim, DI = c.index_head_dim, m = layer.ratio;
  const int64_t R = c.qk_rope_head_dim;
  std::vector<float> latent;
  int64_t groups = 0;
  if (m == 1) {
    latent.resize(n * D);
    k::linear(x, w.comp_wkv.ptr(), n, H, D, latent.data());
    groups = n;
  } else {
    // Prepend the pending tokens of the incomplete group, pool every complete group, keep the rest.
    const int64_t total = src.pending + n;
    std::vector<float> values(total * D), scores(total * D);
    std::copy(src.pending_values.begin(), src.pending_values.end(), values.begin());
    std::copy(src.pending_scores.begin(), src.pending_scores.end(), scores.begin());
    k::linear(x, w.comp_wkv.ptr(), n, H, D, values.data() + src.pending * D);
    k::linear(x, w.comp_wgate.ptr(), n, H, D, scores.data() + src.pending * D);
    groups = total / m;
    latent.resize(groups * D);
    k::compress_pool(values.data(), scores.data(), groups, m, D, latent.data());
    const int64_t rest = total - groups * m;
    src.pending_values.assign(values.begin() + groups * m * D, values.end());
    src.pending_scores.assign(scores.begin() + groups * m * D, scores.end());
    src.pending = rest;
  }
  if (groups == 0) return;
  k::rms_norm(latent.data(), w.comp_norm.ptr(), groups, D, float(c.rms_norm_eps), latent.data());
  std::vector<int64_t> pos(groups);
  for (int64_t g = 0; g < groups; ++g) pos[g] = (src.entries + g) * m;  // first token of the group
  const std::vector<float>& freq = inv_freq_[layer.index];
  // Index keys come from the un-rotated latent; then the latent itself is rotated and stored.
  std::vector<float> keys(groups * DI);
  k::linear(latent.data(), w.idx_wk.ptr(), groups, D, DI, keys.data());
  k::rms_norm(keys.data(), w.idx_k_norm.ptr(), groups, DI, float(c.rms_norm_eps), keys.data());
  k::apply_rope(keys.data(), groups, 1, DI, R, pos.data(), freq.data(), false);
  const int64_t kb = key_codec_.row_bytes, vb = kv_codec_.row_bytes;
  src.keys.resize((src.entries + groups) * kb);
  key_codec_.pack(keys.data(), groups, DI, src.keys.data() + src.entries * kb);
  k::apply_rope(latent.data(), groups, 1, D, R, pos.data(), freq.data(), false);
  src.kv.resize((src.entries + groups) * vb);
  kv_codec_.pack(latent.data(), groups, D, src.kv.data() + src.entries * vb);
  src.entries += groups;
  workspaces_.note_source_write(layer.index);
}

void CpuExecutor::attention(const LayerPlan& layer, const AttentionWeights& w, RequestState& state,
                            Shared& shared, const float* x, int64_t n, float* y) {
  const ModelConfig& c = plan_.config;
  const int64_t H = c.hidden_size, D = c.head_dim, nh = c.num_attention_heads;
  const int64_t R = c.qk_rope_head_dim, W = c.sliding_window, P = state.length;
  const float eps = float(c.rms_norm_eps);
  const std::vector<float>& freq = inv_freq_[layer.index];
  std::vector<int64_t> pos(n);
  for (int64_t t = 0; t < n; ++t) pos[t] = P + t;

  std::vector<float> qr(n * c.q_lora_rank), q(n * nh * D), kv(n * D);
  k::linear(x, w.wq_a.ptr(), n, H, c.q_lora_rank, qr.data());
  k::rms_norm(qr.data(), w.q_norm.ptr(), n, c.q_lora_rank, eps, qr.data());
  k::linear(qr.data(), w.wq_b.ptr(), n, c.q_lora_rank, nh * D, q.data());
  k::apply_rope(q.data(), n, nh, D, R, pos.data(), freq.data(), false);
  k::linear(x, w.wkv.ptr(), n, H, D, kv.data());
  k::rms_norm(kv.data(), w.kv_norm.ptr(), n, D, eps, kv.data());
  k::apply_rope(kv.data(), n, 1, D, R, pos.data(), freq.data(), false);
  if (window_codec_.qdq) window_codec_.qdq(kv.data(), n, D, kv.data());

  // Key rows: the window positions [w0, P + n) (old ones from the ring, then this chunk's), then
  // the group's compressed entries.
  const int64_t w0 = std::max<int64_t>(0, P - W + 1);
  const int64_t n_window = P + n - w0;
  int64_t n_comp = 0;
  SourceState* src = nullptr;
  if (layer.ratio > 0) {
    src = &state.sources.at(layer.kv_source);
    if (layer.role == LayerRole::kFull) compress(layer, w, *src, x, n);
    n_comp = src->entries;
  }
  std::vector<float> keys((n_window + n_comp) * D);
  std::vector<uint8_t>& ring = state.window[layer.index];
  const int64_t rb = window_codec_.row_bytes;
  for (int64_t t = w0; t < P; ++t) {
    window_codec_.unpack(ring.data() + (t % W) * rb, 1, D, keys.data() + (t - w0) * D);
  }
  std::copy(kv.begin(), kv.end(), keys.begin() + (P - w0) * D);

  const int64_t KI = layer.ratio > 0 ? c.index_topk : 0;
  std::vector<int32_t> idx(n * (W + KI), -1);
  for (int64_t s = 0; s < n; ++s) {
    const int64_t t = P + s, lo = std::max<int64_t>(0, t - W + 1);
    for (int64_t j = lo; j <= t; ++j) idx[s * (W + KI) + (j - lo)] = int32_t(j - w0);
  }
  if (layer.ratio > 0) {
    const int64_t m = layer.ratio, T = n_comp;
    // Compressed rows through the per-ratio workspace: dequantised once per forward per source.
    const float* comp = static_cast<const float*>(workspaces_.acquire(
        int(m), layer.kv_source, T, D * int64_t(sizeof(float)), [&](void* dst, int64_t rows) {
          kv_codec_.unpack(src->kv.data(), rows, D, static_cast<float*>(dst));
        }));
    std::copy(comp, comp + T * D, keys.begin() + n_window * D);
    if (layer.role == LayerRole::kFull || layer.role == LayerRole::kReindex) {
      const int64_t HI = c.index_n_heads, DI = c.index_head_dim;
      std::vector<float> qi(n * HI * DI), wts(n * HI), ikeys(T * DI), scores(n * T);
      k::linear(qr.data(), w.idx_wq_b.ptr(), n, c.q_lora_rank, HI * DI, qi.data());
      k::apply_rope(qi.data(), n, HI, DI, R, pos.data(), freq.data(), false);
      if (key_codec_.qdq) key_codec_.qdq(qi.data(), n * HI, DI, qi.data());  // queries: MXFP4 too
      k::linear(x, w.idx_weights_proj.ptr(), n, H, HI, wts.data());
      const float wscale = float(std::pow(double(DI), -0.5) * std::pow(double(HI), -0.5));
      for (float& v : wts) v *= wscale;
      key_codec_.unpack(src->keys.data(), T, DI, ikeys.data());
      std::vector<int64_t> vis(n);
      for (int64_t s = 0; s < n; ++s) vis[s] = (P + s + 1) / m;
      k::indexer_scores(qi.data(), ikeys.data(), wts.data(), vis.data(), n, HI, DI, T,
                        scores.data());
      if (layer.candidates == CandidateRole::kSource) {
        shared.candidates.assign(n * T, 0);
        shared.candidates_width = T;
        if (T > 0) {
          k::candidate_blocks(scores.data(), vis.data(), n, T, c.candidate_topk_blocks,
                              c.candidate_block_size, shared.candidates.data());
        }
      } else if (layer.candidates == CandidateRole::kUses) {
        DSV41RT_CHECK(shared.candidates_width == T, "layer ", layer.index, " uses candidates over ",
                      T, " entries but the candidate source published ", shared.candidates_width);
        k::apply_candidate_mask(scores.data(), shared.candidates.data(), n, T);
      }
      shared.topk.assign(n * KI, -1);
      k::topk_select(scores.data(), n, T, KI, shared.topk.data());
      shared.topk_source = layer.index;
      if (options_.record_decisions) {
        sorted_copy(shared.topk.data(), n, KI, decisions_["topk_L" + std::to_string(layer.index)]);
      }
    }
    DSV41RT_CHECK(shared.topk_source == layer.topk_source, "layer ", layer.index,
                  " expects the top-k of layer ", layer.topk_source, ", found ",
                  shared.topk_source);
    for (int64_t s = 0; s < n; ++s) {
      for (int64_t j = 0; j < KI; ++j) {
        const int32_t e = shared.topk[s * KI + j];
        idx[s * (W + KI) + W + j] = e < 0 ? -1 : int32_t(n_window + e);
      }
    }
  }

  std::vector<float> o(n * nh * D);
  k::sparse_attention(q.data(), keys.data(), idx.data(), w.attn_sink.ptr(), n, nh, D,
                      n_window + n_comp, W + KI, float(1.0 / std::sqrt(double(D))), o.data());
  k::apply_rope(o.data(), n, nh, D, R, pos.data(), freq.data(), true);
  const int64_t g = c.o_groups, kg = nh * D / g, ro = c.o_lora_rank;
  std::vector<float> z(n * g * ro);
  k::grouped_linear(o.data(), w.wo_a.ptr(), n, g, kg, ro, z.data());
  k::linear(z.data(), w.wo_b.ptr(), n, g * ro, H, y);

  // Read first, write last: the ring keeps the newest W positions.
  for (int64_t t = std::max(P, P + n - W); t < P + n; ++t) {
    window_codec_.pack(kv.data() + (t - P) * D, 1, D, ring.data() + (t % W) * rb);
  }
}

void CpuExecutor::moe(const LayerPlan& layer, const MoeWeights& w, const float* x, int64_t n,
                      float* y) {
  const ModelConfig& c = plan_.config;
  const int64_t H = c.hidden_size, I = c.moe_intermediate_size, E = layer.n_experts,
                kk = layer.experts_per_tok;
  std::vector<int32_t> idx(n * kk);
  std::vector<float> weight(n * kk);
  k::moe_route(x, w.gate.ptr(), w.bias.ptr(), n, H, E, kk, float(c.routed_scaling_factor),
               idx.data(), weight.data(), c.norm_topk_prob);
  if (options_.record_decisions) {
    sorted_copy(idx.data(), n, kk, decisions_["experts_L" + std::to_string(layer.index)]);
  }
  std::vector<k::SwigluWeights> experts(E);
  for (int64_t e = 0; e < E; ++e) experts[e] = {w.w1[e].ptr(), w.w3[e].ptr(), w.w2[e].ptr()};
  const k::SwigluWeights shared{w.shared_w1.ptr(), w.shared_w3.ptr(), w.shared_w2.ptr()};
  k::moe_forward(x, idx.data(), weight.data(), n, H, kk, E, I, experts.data(), &shared, I,
                 float(c.swiglu_limit), y);
}

void CpuExecutor::forward(RequestState& state, const int32_t* tokens, int64_t n, float* logits,
                          bool all_logits) {
  DSV41RT_CHECK(n > 0, "forward needs at least one token");
  const ModelConfig& c = plan_.config;
  const int64_t H = c.hidden_size, hc = c.hc_mult, mix = int64_t(2 + hc) * hc;
  const float eps = float(c.rms_norm_eps), hc_eps = float(c.hc_eps);
  workspaces_.begin_forward();
  decisions_.clear();
  Shared shared;

  std::vector<float> X(n * hc * H), X1(n * hc * H), u(n * H), xn(n * H), yv(n * H);
  std::vector<float> pre(n * hc, 0.0f), a_pre(n * hc), a_post(n * hc), a_comb(n * hc * hc);
  std::vector<float> f_pre(n * hc), f_post(n * hc), f_comb(n * hc * hc);
  embed(tokens, n, X.data());
  for (int64_t t = 0; t < n; ++t) pre[t * hc] = 1.0f;  // block 0 reads stream 0 (the embedding)

  // Engram ids: the history before this chunk (blocking -1 before position 0), then the chunk.
  std::vector<int64_t> cids;
  int64_t hist = 0;
  if (c.engram) {
    hist = c.engram->max_ngram_size - 1;
    cids.assign(hist + n, -1);
    const int64_t have = std::min<int64_t>(hist, int64_t(state.history.size()));
    for (int64_t i = 0; i < have; ++i) {
      cids[hist - have + i] = engram_.token_map[state.history[state.history.size() - have + i]];
    }
    for (int64_t t = 0; t < n; ++t) cids[hist + t] = engram_.token_map[tokens[t]];
  }

  int engram_pos = 0;
  for (size_t li = 0; li < plan_.layers.size(); ++li) {
    const LayerPlan& layer = plan_.layers[li];
    const BlockWeights& w = weights_.layers[li];
    if (layer.engram) engram(engram_pos++, w, cids, n, X.data());
    k::hc_mix(X.data(), w.hc_attn_fn.ptr(), w.hc_attn_base.ptr(), w.hc_attn_scale.ptr(), n, hc, H,
              eps, hc_eps, c.hc_sinkhorn_iters, a_pre.data(), a_post.data(), a_comb.data());
    k::hc_collapse(X.data(), pre.data(), n, hc, H, u.data());
    k::rms_norm(u.data(), w.attn_norm.ptr(), n, H, eps, xn.data());
    attention(layer, w.attn, state, shared, xn.data(), n, yv.data());
    k::hc_expand(X.data(), yv.data(), a_post.data(), a_comb.data(), n, hc, H, X1.data());
    k::hc_mix(X1.data(), w.hc_ffn_fn.ptr(), w.hc_ffn_base.ptr(), w.hc_ffn_scale.ptr(), n, hc, H,
              eps, hc_eps, c.hc_sinkhorn_iters, f_pre.data(), f_post.data(), f_comb.data());
    k::hc_collapse(X1.data(), a_pre.data(), n, hc, H, u.data());
    k::rms_norm(u.data(), w.ffn_norm.ptr(), n, H, eps, xn.data());
    moe(layer, w.moe, xn.data(), n, yv.data());
    k::hc_expand(X1.data(), yv.data(), f_post.data(), f_comb.data(), n, hc, H, X.data());
    pre.swap(f_pre);
  }
  k::hc_collapse(X.data(), pre.data(), n, hc, H, u.data());
  const int64_t first = all_logits ? 0 : n - 1, rows = n - first;
  k::rms_norm(u.data() + first * H, weights_.norm.ptr(), rows, H, eps, xn.data());
  k::linear(xn.data(), weights_.head.ptr(), rows, H, c.vocab_size, logits);

  state.length += n;
  if (c.engram) {
    for (int64_t t = 0; t < n; ++t) state.history.push_back(tokens[t]);
    if (int64_t(state.history.size()) > hist) {
      state.history.erase(state.history.begin(), state.history.end() - hist);
    }
  }
}

}  // namespace dsv41rt::model
