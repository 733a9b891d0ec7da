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
#include "core/status.h"

namespace dsv41rt::model {

namespace k = kernels::cpu;

// One batch item during a forward, with what its layers publish for the next ones (spec §2.7.2).
struct CpuExecutor::Item {
  BatchItem* b = nullptr;
  int64_t row0 = 0, n = 0, P = 0;  // first row in the batch, tokens, start position
  // The item's query rows on this rank (offsets into the chunk, ascending) and the local row of
  // the first; without context parallelism every row, from row0.
  std::vector<int64_t> sel;
  int64_t lrow0 = 0;
  std::vector<int64_t> positions;  // of the selected rows
  std::vector<int64_t> cids;       // Engram: compressed ids of the history slots, then the chunk
  int64_t comp_offset = 0;         // first workspace row of this item's compressed entries
  std::vector<int32_t> topk;       // [n, index_topk] of the latest index source
  int topk_source = -1;
  std::vector<uint8_t> candidates;  // [n, T] of the candidate source
  int64_t candidates_width = -1;
};

struct CpuExecutor::Shared {};

// The batch's rows as this rank sees them: all N rows carry state (every rank writes the whole
// batch's KV at its global locations), the local rows g % size == rank carry queries.
struct CpuExecutor::Rows {
  comm::Communicator* comm = nullptr;  // null: no context parallelism, every row is local
  int64_t N = 0;
  std::vector<int64_t> local;  // global row of each local row
  int64_t max_local = 0;       // ceil(N / size): every rank's all-gather count

  int64_t NL() const { return int64_t(local.size()); }
  // Local rows [NL, dim] -> all rows [N, dim] in global order (one all-gather).
  void gather(const float* x, int64_t dim, std::vector<float>& out) const {
    const int64_t P = comm->size();
    std::vector<float> send(max_local * dim, 0.0f), recv(P * max_local * dim);
    if (NL() > 0) std::copy(x, x + NL() * dim, send.begin());
    comm->all_gather(send.data(), recv.data(), size_t(max_local * dim), DType::kF32);
    out.resize(N * dim);
    for (int64_t g = 0; g < N; ++g) {
      const float* src = recv.data() + ((g % P) * max_local + g / P) * dim;
      std::copy(src, src + dim, out.begin() + g * dim);
    }
  }
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

}  // namespace

void append_sorted_rows(const int32_t* src, int64_t rows, int64_t k, std::vector<int32_t>& dst) {
  const size_t at = dst.size();
  dst.insert(dst.end(), src, src + rows * k);
  for (int64_t r = 0; r < rows; ++r) {
    std::sort(dst.begin() + at + r * k, dst.begin() + at + (r + 1) * k);
  }
}

CpuExecutor::CpuExecutor(ModelPlan plan, ModelWeights weights, EngramTables engram,
                         ExecutorOptions options)
    : plan_(std::move(plan)),
      weights_(std::move(weights)),
      engram_(std::move(engram)),
      options_(options),
      bf16_(options.precision == "bf16") {
  const ModelConfig& c = plan_.config;
  DSV41RT_CHECK_CODE(kInternal, !weights_.head.data.empty(),
                     "the CPU executor needs weights loaded with host values");
  check_engram_tables(c, engram_);
  inv_freq_ = rope_inv_freqs(plan_);
  layout_ = make_state_layout(plan_, options_);
  memory_ = plan_memory(plan_, *layout_, options_);
  const model::PoolGeometry g = layout_->geometry();
  pool_ = std::make_unique<model::KvPool>(model::KvPool::from_budget(
      g, memory_.num_slots * g.slot_bytes + memory_.num_pages * g.page_bytes, memory_.num_slots));
}

void check_engram_tables(const ModelConfig& c, const EngramTables& engram) {
  if (!c.engram) return;
  DSV41RT_CHECK(engram.layers.size() == c.engram->layer_ids.size(), c.source,
                ": Engram tables for ", engram.layers.size(), " layers, config has ",
                c.engram->layer_ids.size());
  DSV41RT_CHECK(int64_t(engram.token_map.size()) == c.vocab_size, c.source,
                ": Engram token map has ", engram.token_map.size(), " entries, vocab is ",
                c.vocab_size);
}

std::vector<std::vector<float>> rope_inv_freqs(const ModelPlan& plan) {
  const ModelConfig& c = plan.config;
  std::vector<std::vector<float>> out;
  for (const LayerPlan& layer : plan.layers) {
    kernels::YarnParams yarn;
    const kernels::YarnParams* yp = nullptr;
    if (layer.yarn && c.yarn) {
      yarn.factor = c.yarn->factor;
      yarn.original_max_position = c.yarn->original_max_position;
      yarn.beta_fast = c.yarn->beta_fast;
      yarn.beta_slow = c.yarn->beta_slow;
      yp = &yarn;
    }
    out.push_back(k::rope_inv_freq(c.qk_rope_head_dim, layer.rope_base, yp));
  }
  return out;
}

std::unique_ptr<StateLayout> make_state_layout(const ModelPlan& plan, const ExecutorOptions& o) {
  const ModelConfig& c = plan.config;
  const bool q = o.cache_quant;
  return std::make_unique<StateLayout>(
      plan,
      make_codec(q, c.head_dim, kernels::fp8_window_row_bytes(c.head_dim), k::fp8_window_pack,
                 k::fp8_window_unpack, k::fp8_window_qdq),
      make_codec(q, c.head_dim, kernels::nvfp4_row_bytes(c.head_dim), k::nvfp4_pack, k::nvfp4_unpack,
                 k::nvfp4_qdq),
      make_codec(q, c.index_head_dim, kernels::mxfp4_row_bytes(c.index_head_dim), k::mxfp4_pack,
                 k::mxfp4_unpack, k::mxfp4_qdq),
      o.page_tokens);
}

MemoryPlan plan_memory(const ModelPlan& plan, const StateLayout& layout, const ExecutorOptions& o) {
  const ModelConfig& c = plan.config;
  const model::PoolGeometry g = layout.geometry();
  MemoryPlan m;
  m.budget_bytes = o.kv_memory_bytes;
  m.slot_bytes = g.slot_bytes;
  m.page_bytes = g.page_bytes;
  m.page_tokens = g.page_tokens;
  const int64_t P = g.page_tokens, D = c.head_dim, DI = c.index_head_dim, f = sizeof(float);
  // Per page: each ratio's dequant workspace holds P/m FP32 rows per page of context; attention
  // copies a request's rows next to its window rows (<= P rows); the indexer unpacks P index keys
  // and scores P entries for every query of the forward (FP32) with a byte of candidate mask each.
  std::vector<int> ratios;
  for (const LayerPlan& l : plan.layers) {
    if (l.role == LayerRole::kFull &&
        std::find(ratios.begin(), ratios.end(), l.ratio) == ratios.end()) {
      ratios.push_back(l.ratio);
    }
  }
  for (int r : ratios) m.workspace_bytes_per_page += (P / r) * D * f;
  m.workspace_bytes_per_page += P * D * f + P * DI * f;
  const int64_t scores_per_position = o.token_budget * (f + 1);  // FP32 score + mask byte
  if (o.max_context == 0) m.workspace_bytes_per_page += P * scores_per_position;
  // Fixed: per-token activations of one forward (streams, projections, attention, MoE) and the
  // logits of every sampled row.
  const int64_t hc = c.hc_mult, H = c.hidden_size, nh = c.num_attention_heads;
  const int64_t per_token =
      f * (2 * hc * H + 4 * H + 3 * hc + 2 * hc * hc + c.q_lora_rank + 2 * nh * D + 2 * D +
           int64_t(c.o_groups) * c.o_lora_rank + int64_t(c.index_n_heads) * (DI + 1) +
           3 * c.moe_intermediate_size + int64_t(c.sliding_window) + c.index_topk);
  m.scratch_bytes = o.token_budget * per_token + o.max_requests * c.vocab_size * f;
  if (o.max_context > 0) m.scratch_bytes += o.max_context * scores_per_position;
  const int64_t per_page = g.page_bytes + m.workspace_bytes_per_page;
  const int64_t left = o.kv_memory_bytes - m.scratch_bytes;
  m.num_slots = o.max_requests;
  if (g.slot_bytes > 0) m.num_slots = std::min(m.num_slots, (left - per_page) / g.slot_bytes);
  m.num_pages = m.num_slots >= 1 ? (left - m.num_slots * g.slot_bytes) / per_page : 0;
  DSV41RT_CHECK_CODE(kOutOfRange, m.num_slots >= 1 && m.num_pages >= 1, "KV memory budget of ",
                     o.kv_memory_bytes, " bytes is too small: scratch ", m.scratch_bytes,
                     " + one request slot ", g.slot_bytes, " + one page (with workspaces) ",
                     per_page, " = ", m.scratch_bytes + g.slot_bytes + per_page, " bytes");
  return m;
}

std::string MemoryPlan::describe() const {
  auto mib = [](int64_t b) {
    return std::to_string(b / 1024 / 1024) + "." + std::to_string((b / 1024 % 1024) * 10 / 1024) +
           " MiB";
  };
  return "memory plan: " + mib(budget_bytes) + " = " + std::to_string(num_slots) +
         " request slots x " + std::to_string(slot_bytes) + " B + " + std::to_string(num_pages) +
         " pages x (" + std::to_string(page_bytes) + " B state + " +
         std::to_string(workspace_bytes_per_page) + " B workspaces) + " + mib(scratch_bytes) +
         " scratch; " + std::to_string(bytes_per_token()) + " B/token of state, capacity " +
         std::to_string(num_pages * page_tokens) + " tokens";
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
    for (int64_t i = 0; i < hc; ++i) {
      std::memcpy(X + (t * hc + i) * H, row.data(), H * sizeof(float));
    }
  }
}

void CpuExecutor::engram(int layer_pos, const BlockWeights& w, const Item& it, float* X) const {
  const ModelConfig& c = plan_.config;
  const EngramSpec& e = *c.engram;
  const EngramTables::Layer& L = engram_.layers[layer_pos];
  const int64_t cols = int64_t(e.max_ngram_size - 1) * e.n_heads, hd = e.head_dim, n = it.n;
  std::vector<int64_t> rows(n * cols);
  const int64_t pad = engram_.token_map[e.pad_token_id];
  k::engram_hash_rows(it.cids.data(), n, e.max_ngram_size, e.n_heads, L.multipliers.data(),
                      L.primes.data(), L.offsets.data(), pad, rows.data());
  const EngramWeights& ew = *w.engram;
  const int64_t nq = int64_t(it.sel.size());  // this rank's rows of the item
  std::vector<float> emb(nq * cols * hd);
  for (int64_t q = 0; q < nq; ++q) {
    for (int64_t j = 0; j < cols; ++j) {
      const int64_t r = rows[it.sel[q] * cols + j];
      DSV41RT_CHECK(r >= 0 && r < ew.rows, "Engram row ", r, " outside the table (", ew.rows,
                    " rows)");
      k::dequant_fp8_blocks(ew.table + r * hd, ew.table_scale + r * (hd / 32), 1, hd, 1, 32,
                            emb.data() + (q * cols + j) * hd);
    }
  }
  k::engram_forward(X, emb.data(), ew.wkv.ptr(), ew.q_weight.ptr(), ew.k_weight.ptr(), nullptr, nq,
                    c.hc_mult, c.hidden_size, cols * hd, float(c.rms_norm_eps));
}

void CpuExecutor::compress(const LayerPlan& layer, const AttentionWeights& w, Item& it,
                           const float* x) {
  const ModelConfig& c = plan_.config;
  const int64_t H = c.hidden_size, D = c.head_dim, DI = c.index_head_dim, m = layer.ratio;
  const int64_t R = c.qk_rope_head_dim, n = it.n, P = it.P;
  const RequestView& req = it.b->request;
  std::vector<float> latent;
  int64_t groups = 0;
  if (m == 1) {
    latent.resize(n * D);
    lin(x, w.comp_wkv, n, H, D, latent.data());
    groups = n;
  } else {
    // Prepend the pending tokens of the incomplete group, pool every complete group, keep the rest.
    const int64_t pending = P % m, total = pending + n;
    std::vector<float> values(total * D), scores(total * D);
    float* pv = layout_->pending_values(req, layer.index);
    float* ps = layout_->pending_scores(req, layer.index);
    std::copy(pv, pv + pending * D, values.begin());
    std::copy(ps, ps + pending * D, scores.begin());
    lin(x, w.comp_wkv, n, H, D, values.data() + pending * D);
    lin(x, w.comp_wgate, n, H, D, scores.data() + pending * D);
    groups = total / m;
    latent.resize(groups * D);
    k::compress_pool(values.data(), scores.data(), groups, m, D, latent.data());
    const int64_t rest = total - groups * m;
    std::copy(values.begin() + groups * m * D, values.end(), pv);
    std::copy(scores.begin() + groups * m * D, scores.end(), ps);
    (void)rest;
  }
  if (groups == 0) return;
  const int64_t e0 = P / m;  // entries already stored
  k::rms_norm(latent.data(), w.comp_norm.ptr(), groups, D, float(c.rms_norm_eps), latent.data());
  std::vector<int64_t> pos(groups);
  for (int64_t g = 0; g < groups; ++g) pos[g] = (e0 + g) * m;  // the group's first position
  const std::vector<float>& freq = inv_freq_[layer.index];
  // Index keys come from the un-rotated latent; then the latent itself is rotated and stored.
  std::vector<float> keys(groups * DI);
  lin(latent.data(), w.idx_wk, groups, D, DI, keys.data());
  k::rms_norm(keys.data(), w.idx_k_norm.ptr(), groups, DI, float(c.rms_norm_eps), keys.data());
  k::apply_rope(keys.data(), groups, 1, DI, R, pos.data(), freq.data(), false);
  k::apply_rope(latent.data(), groups, 1, D, R, pos.data(), freq.data(), false);
  for (int64_t g = 0; g < groups; ++g) {
    layout_->key_codec().pack(keys.data() + g * DI, 1, DI,
                              layout_->key_row(*pool_, req, layer.index, e0 + g));
    layout_->kv_codec().pack(latent.data() + g * D, 1, D,
                             layout_->kv_row(*pool_, req, layer.index, e0 + g));
  }
}

void CpuExecutor::item_attention(const LayerPlan& layer, const AttentionWeights& w, Item& it,
                                 Shared&, const float* comp, const float* x, const float* qr,
                                 float* q, float* kv, float* y) {
  const ModelConfig& c = plan_.config;
  const int64_t H = c.hidden_size, D = c.head_dim, nh = c.num_attention_heads;
  const int64_t R = c.qk_rope_head_dim, W = c.sliding_window, P = it.P, n = it.n;
  const int64_t nq = int64_t(it.sel.size());  // query rows: x, qr, q and y hold only these
  const std::vector<float>& freq = inv_freq_[layer.index];
  const RequestView& req = it.b->request;
  const RowCodec& wc = layout_->window_codec();

  // Key rows: window positions [w0, P + n) (older ones from the ring, then this chunk's), then
  // this item's compressed entries of the group.
  const int64_t w0 = std::max<int64_t>(0, P - W + 1);
  const int64_t n_window = P + n - w0;
  const int64_t T = layer.ratio > 0 ? (P + n) / layer.ratio : 0;
  std::vector<float> keys((n_window + T) * D);
  for (int64_t t = w0; t < P; ++t) {
    wc.unpack(layout_->window_row(req, layer.index, t), 1, D, keys.data() + (t - w0) * D);
  }
  std::copy(kv, kv + n * D, keys.begin() + (P - w0) * D);
  if (T > 0)
    std::copy(comp + it.comp_offset * D, comp + (it.comp_offset + T) * D,
              keys.begin() + n_window * D);

  const int64_t KI = layer.ratio > 0 ? c.index_topk : 0;
  std::vector<int32_t> idx(nq * (W + KI), -1);
  for (int64_t s = 0; s < nq; ++s) {
    const int64_t t = P + it.sel[s], lo = std::max<int64_t>(0, t - W + 1);
    for (int64_t j = lo; j <= t; ++j) idx[s * (W + KI) + (j - lo)] = int32_t(j - w0);
  }
  if (layer.ratio > 0) {
    const int64_t m = layer.ratio;
    if (layer.role == LayerRole::kFull || layer.role == LayerRole::kReindex) {
      const int64_t HI = c.index_n_heads, DI = c.index_head_dim;
      const RowCodec& kc = layout_->key_codec();
      std::vector<float> qi(nq * HI * DI), wts(nq * HI), ikeys(T * DI), scores(nq * T);
      lin(qr, w.idx_wq_b, nq, c.q_lora_rank, HI * DI, qi.data());
      k::apply_rope(qi.data(), nq, HI, DI, R, it.positions.data(), freq.data(), false);
      if (kc.qdq) kc.qdq(qi.data(), nq * HI, DI, qi.data());  // queries are MXFP4 too
      lin(x, w.idx_weights_proj, nq, H, HI, wts.data());
      const float wscale = float(std::pow(double(DI), -0.5) * std::pow(double(HI), -0.5));
      for (float& v : wts) v *= wscale;
      for (int64_t j = 0; j < T; ++j) {
        kc.unpack(layout_->key_row(*pool_, req, layer.kv_source, j), 1, DI, ikeys.data() + j * DI);
      }
      std::vector<int64_t> vis(nq);
      for (int64_t s = 0; s < nq; ++s) vis[s] = (P + it.sel[s] + 1) / m;
      k::indexer_scores(qi.data(), ikeys.data(), wts.data(), vis.data(), nq, HI, DI, T,
                        scores.data());
      if (layer.candidates == CandidateRole::kSource) {
        it.candidates.assign(nq * T, 0);
        it.candidates_width = T;
        if (T > 0) {
          k::candidate_blocks(scores.data(), vis.data(), nq, T, c.candidate_topk_blocks,
                              c.candidate_block_size, it.candidates.data());
        }
      } else if (layer.candidates == CandidateRole::kUses) {
        DSV41RT_CHECK(it.candidates_width == T, "layer ", layer.index, " uses candidates over ", T,
                      " entries but the candidate source published ", it.candidates_width);
        k::apply_candidate_mask(scores.data(), it.candidates.data(), nq, T);
      }
      it.topk.assign(nq * KI, -1);
      k::topk_select(scores.data(), nq, T, KI, it.topk.data());
      it.topk_source = layer.index;
    }
    DSV41RT_CHECK(it.topk_source == layer.topk_source, "layer ", layer.index,
                  " expects the top-k of layer ", layer.topk_source, ", found ", it.topk_source);
    for (int64_t s = 0; s < nq; ++s) {
      for (int64_t j = 0; j < KI; ++j) {
        const int32_t e = it.topk[s * KI + j];
        idx[s * (W + KI) + W + j] = e < 0 ? -1 : int32_t(n_window + e);
      }
    }
  }

  std::vector<float> o(nq * nh * D);
  k::sparse_attention(q, keys.data(), idx.data(), w.attn_sink.ptr(), nq, nh, D, n_window + T,
                      W + KI, float(1.0 / std::sqrt(double(D))), o.data());
  k::apply_rope(o.data(), nq, nh, D, R, it.positions.data(), freq.data(), true);
  const int64_t g = c.o_groups, kg = nh * D / g, ro = c.o_lora_rank;
  std::vector<float> z(nq * g * ro);
  grouped_lin(o.data(), w.wo_a, nq, g, kg, ro, z.data());
  lin(z.data(), w.wo_b, nq, g * ro, H, y);
}

void CpuExecutor::attention(const LayerPlan& layer, const AttentionWeights& w,
                            std::vector<Item>& items, const Rows& rows, const float* x, float* y) {
  const ModelConfig& c = plan_.config;
  const int64_t H = c.hidden_size, D = c.head_dim, nh = c.num_attention_heads;
  const int64_t R = c.qk_rope_head_dim, W = c.sliding_window;
  const float eps = float(c.rms_norm_eps);
  const int64_t N = rows.N, NL = rows.NL();
  const std::vector<float>& freq = inv_freq_[layer.index];
  std::vector<int64_t> pos, pos_q;
  for (const Item& it : items) {
    for (int64_t t = 0; t < it.n; ++t) pos.push_back(it.P + t);
    pos_q.insert(pos_q.end(), it.positions.begin(), it.positions.end());
  }
  // The KV projection, the window ring and the compressor need every row's hidden state (each
  // rank writes the whole batch's state): under context parallelism, one all-gather.
  std::vector<float> gathered;
  const float* xg = x;
  if (rows.comm) {
    rows.gather(x, H, gathered);
    xg = gathered.data();
  }

  // Projections (row-independent ops): queries of the local rows, KV of all rows.
  std::vector<float> qr(NL * c.q_lora_rank), q(NL * nh * D), kv(N * D);
  if (NL > 0) {
    lin(x, w.wq_a, NL, H, c.q_lora_rank, qr.data());
    k::rms_norm(qr.data(), w.q_norm.ptr(), NL, c.q_lora_rank, eps, qr.data());
    lin(qr.data(), w.wq_b, NL, c.q_lora_rank, nh * D, q.data());
    k::apply_rope(q.data(), NL, nh, D, R, pos_q.data(), freq.data(), false);
  }
  lin(xg, w.wkv, N, H, D, kv.data());
  k::rms_norm(kv.data(), w.kv_norm.ptr(), N, D, eps, kv.data());
  k::apply_rope(kv.data(), N, 1, D, R, pos.data(), freq.data(), false);
  const RowCodec& wc = layout_->window_codec();
  if (wc.qdq) wc.qdq(kv.data(), N, D, kv.data());

  // Compressed entries: the producer appends every item's new groups first, then the group's
  // rows of all items are dequantised once into the ratio's workspace (reused by later layers).
  const float* comp = nullptr;
  if (layer.ratio > 0) {
    if (layer.role == LayerRole::kFull) {
      for (Item& it : items) compress(layer, w, it, xg + it.row0 * H);
      workspaces_.note_source_write(layer.index);
    }
    int64_t rows = 0;
    for (Item& it : items) {
      it.comp_offset = rows;
      rows += (it.P + it.n) / layer.ratio;
    }
    comp = static_cast<const float*>(workspaces_.acquire(
        layer.ratio, layer.kv_source, rows, D * int64_t(sizeof(float)), [&](void* dst, int64_t) {
          float* out = static_cast<float*>(dst);
          const RowCodec& cc = layout_->kv_codec();
          for (const Item& it : items) {
            const int64_t T = (it.P + it.n) / layer.ratio;
            for (int64_t j = 0; j < T; ++j) {
              cc.unpack(layout_->kv_row(*pool_, it.b->request, layer.kv_source, j), 1, D,
                        out + (it.comp_offset + j) * D);
            }
          }
        }));
  }
  Shared shared;
  for (Item& it : items) {
    if (it.sel.empty()) continue;  // none of the item's rows is this rank's
    item_attention(layer, w, it, shared, comp, x + it.lrow0 * H,
                   qr.data() + it.lrow0 * c.q_lora_rank, q.data() + it.lrow0 * nh * D,
                   kv.data() + it.row0 * D, y + it.lrow0 * H);
  }
  if (options_.record_decisions &&
      (layer.role == LayerRole::kFull || layer.role == LayerRole::kReindex)) {
    auto& rec = decisions_["topk_L" + std::to_string(layer.index)];
    for (const Item& it : items) {
      append_sorted_rows(it.topk.data(), int64_t(it.sel.size()), c.index_topk, rec);
    }
  }
  // Read first, write last: each ring keeps the newest W positions.
  for (Item& it : items) {
    for (int64_t t = std::max(it.P, it.P + it.n - W); t < it.P + it.n; ++t) {
      wc.pack(kv.data() + (it.row0 + t - it.P) * D, 1, D,
              layout_->window_row(it.b->request, layer.index, t));
    }
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
    append_sorted_rows(idx.data(), n, kk, decisions_["experts_L" + std::to_string(layer.index)]);
  }
  std::vector<kernels::SwigluWeights> experts(E);
  for (int64_t e = 0; e < E; ++e) experts[e] = {w.w1[e].ptr(), w.w3[e].ptr(), w.w2[e].ptr()};
  const kernels::SwigluWeights shared{w.shared_w1.ptr(), w.shared_w3.ptr(), w.shared_w2.ptr()};
  // Tensor cores on the GPU when all six expert matrices are BF16-exact (one kernel, one type).
  bool tc = tc_ && bf16_exact(w.shared_w1) && bf16_exact(w.shared_w3) && bf16_exact(w.shared_w2);
  for (int64_t e = 0; e < E && tc; ++e) {
    tc = bf16_exact(w.w1[e]) && bf16_exact(w.w3[e]) && bf16_exact(w.w2[e]);
  }
  k::moe_forward(x, idx.data(), weight.data(), n, H, kk, E, I, experts.data(), &shared, I,
                 float(c.swiglu_limit), y, /*bf16_inputs=*/tc);
}

void CpuExecutor::lin(const float* x, const Tensor& w, int64_t m, int64_t k, int64_t n,
                      float* y) const {
  if (!tc_ || !bf16_exact(w)) return k::linear(x, w.ptr(), m, k, n, y);
  std::vector<float> xr(x, x + m * k);
  k::round_to_bf16(xr.data(), m * k);
  k::linear(xr.data(), w.ptr(), m, k, n, y);
}

void CpuExecutor::grouped_lin(const float* x, const Tensor& w, int64_t m, int64_t g, int64_t k,
                              int64_t n, float* y) const {
  if (!tc_ || !bf16_exact(w)) return k::grouped_linear(x, w.ptr(), m, g, k, n, y);
  std::vector<float> xr(x, x + m * g * k);
  k::round_to_bf16(xr.data(), m * g * k);
  k::grouped_linear(xr.data(), w.ptr(), m, g, k, n, y);
}

void CpuExecutor::copy_state(const RequestView& src, const RequestView& dst) {
  check_copy_state(*pool_, src, dst);
  const model::PoolGeometry& g = pool_->geometry();
  std::memcpy(dst.slot, src.slot, size_t(g.slot_bytes));
  for (int64_t i = 0; i < pool_->pages_for(src.length); ++i) {
    std::memcpy(pool_->page_data(dst.pages[i]), pool_->page_data(src.pages[i]),
                size_t(g.page_bytes));
  }
}

void CpuExecutor::run(std::vector<BatchItem>& batch, comm::Communicator* comm) {
  DSV41RT_CHECK(!batch.empty(), "forward needs at least one item");
  const ModelConfig& c = plan_.config;
  const int64_t H = c.hidden_size, hc = c.hc_mult;
  const float eps = float(c.rms_norm_eps), hc_eps = float(c.hc_eps);
  const int64_t hist = layout_->history_len();

  std::vector<Item> items(batch.size());
  int64_t N = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    BatchItem& b = batch[i];
    DSV41RT_CHECK(b.n > 0 && b.tokens, "batch item ", i, " has no tokens");
    DSV41RT_CHECK(b.request.slot != nullptr, "batch item ", i, " has no state slot");
    DSV41RT_CHECK(b.request.n_pages * layout_->page_tokens() >= b.request.length + b.n,
                  "batch item ", i, ": pages cover ", b.request.n_pages * layout_->page_tokens(),
                  " positions, the forward needs ", b.request.length + b.n);
    Item& it = items[i];
    it.b = &b;
    it.row0 = N;
    it.n = b.n;
    it.P = b.request.length;
    for (int64_t t = 0; t < b.n; ++t) {  // every rank checks every token (ranks fail together)
      DSV41RT_CHECK(b.tokens[t] >= 0 && b.tokens[t] < c.vocab_size, "token id ", b.tokens[t],
                    " at index ", t, " of batch item ", i, " is outside the vocabulary [0, ",
                    c.vocab_size, ")");
    }
    if (c.engram) {
      // History slots hold the last min(P, hist) ids; positions before 0 block the lookback (-1).
      const int32_t* h = layout_->engram_history(b.request);
      it.cids.assign(hist + b.n, -1);
      for (int64_t s = std::max<int64_t>(0, hist - it.P); s < hist; ++s) {
        it.cids[s] = engram_.token_map[h[s]];
      }
      for (int64_t t = 0; t < b.n; ++t) {
        DSV41RT_CHECK(b.tokens[t] >= 0 && b.tokens[t] < c.vocab_size, "token id ", b.tokens[t],
                      " is outside the vocabulary [0, ", c.vocab_size, ")");
        it.cids[hist + t] = engram_.token_map[b.tokens[t]];
      }
    }
    N += b.n;
  }
  tc_ = bf16_ && N > 8;  // the GPU's per-forward choice (CudaExecutor::kFp32MaxRows)
  // This rank's rows: round-robin over the batch's global rows (every row without CP).
  Rows rows;
  rows.comm = comm;
  rows.N = N;
  const int64_t size = comm ? comm->size() : 1, rank = comm ? comm->rank() : 0;
  rows.max_local = (N + size - 1) / size;
  for (Item& it : items) {
    it.lrow0 = rows.NL();
    for (int64_t t = 0; t < it.n; ++t) {
      if ((it.row0 + t) % size != rank) continue;
      it.sel.push_back(t);
      it.positions.push_back(it.P + t);
      rows.local.push_back(it.row0 + t);
    }
  }
  const int64_t NL = rows.NL();
  workspaces_.begin_forward();
  decisions_.clear();

  std::vector<float> X(NL * hc * H), X1(NL * hc * H), u(NL * H), xn(NL * H), yv(NL * H);
  std::vector<float> pre(NL * hc, 0.0f), a_pre(NL * hc), a_post(NL * hc), a_comb(NL * hc * hc);
  std::vector<float> f_pre(NL * hc), f_post(NL * hc), f_comb(NL * hc * hc);
  for (const Item& it : items) {
    for (size_t q = 0; q < it.sel.size(); ++q) {
      embed(it.b->tokens + it.sel[q], 1, X.data() + (it.lrow0 + int64_t(q)) * hc * H);
    }
  }
  for (int64_t t = 0; t < NL; ++t) pre[t * hc] = 1.0f;  // block 0 reads stream 0 (the embedding)

  int engram_pos = 0;
  for (size_t li = 0; li < plan_.layers.size(); ++li) {
    const LayerPlan& layer = plan_.layers[li];
    const BlockWeights& w = weights_.layers[li];
    if (layer.engram) {
      for (const Item& it : items) {
        if (!it.sel.empty()) engram(engram_pos, w, it, X.data() + it.lrow0 * hc * H);
      }
      ++engram_pos;
    }
    // A CP rank may own no rows of a short batch: it still takes part in the all-gathers and
    // writes every row's state (attention), and skips the row-wise ops.
    if (NL > 0) {
      k::hc_mix(X.data(), w.hc_attn_fn.ptr(), w.hc_attn_base.ptr(), w.hc_attn_scale.ptr(), NL, hc,
                H, eps, hc_eps, c.hc_sinkhorn_iters, a_pre.data(), a_post.data(), a_comb.data());
      k::hc_collapse(X.data(), pre.data(), NL, hc, H, u.data());
      k::rms_norm(u.data(), w.attn_norm.ptr(), NL, H, eps, xn.data());
    }
    attention(layer, w.attn, items, rows, xn.data(), yv.data());
    if (NL > 0) {
      k::hc_expand(X.data(), yv.data(), a_post.data(), a_comb.data(), NL, hc, H, X1.data());
      k::hc_mix(X1.data(), w.hc_ffn_fn.ptr(), w.hc_ffn_base.ptr(), w.hc_ffn_scale.ptr(), NL, hc, H,
                eps, hc_eps, c.hc_sinkhorn_iters, f_pre.data(), f_post.data(), f_comb.data());
      k::hc_collapse(X1.data(), a_pre.data(), NL, hc, H, u.data());
      k::rms_norm(u.data(), w.ffn_norm.ptr(), NL, H, eps, xn.data());
      moe(layer, w.moe, xn.data(), NL, yv.data());
      k::hc_expand(X1.data(), yv.data(), f_post.data(), f_comb.data(), NL, hc, H, X.data());
    }
    pre.swap(f_pre);
  }
  if (NL > 0) k::hc_collapse(X.data(), pre.data(), NL, hc, H, u.data());
  // Under context parallelism every rank gathers the final hidden states and computes the
  // logits of every wanted row (the same values on every rank).
  std::vector<float> u_all;
  if (comm) {
    rows.gather(u.data(), H, u_all);
  } else {
    u_all.swap(u);
  }
  // Head: only the rows whose logits are wanted, in one GEMM.
  std::vector<int64_t> head_rows;
  for (const Item& it : items) {
    if (!it.b->logits) continue;  // nobody reads them: no head GEMM for these rows
    for (int64_t t = it.b->all_logits ? 0 : it.n - 1; t < it.n; ++t) {
      head_rows.push_back(it.row0 + t);
    }
  }
  std::vector<float> hn(head_rows.size() * H);
  for (size_t r = 0; r < head_rows.size(); ++r) {
    k::rms_norm(u_all.data() + head_rows[r] * H, weights_.norm.ptr(), 1, H, eps, hn.data() + r * H);
  }
  const int64_t V = c.vocab_size;
  std::vector<float> logits(head_rows.size() * V);
  lin(hn.data(), weights_.head, int64_t(head_rows.size()), H, V, logits.data());
  size_t r = 0;
  for (const Item& it : items) {
    if (!it.b->logits) continue;
    const int64_t count = it.b->all_logits ? it.n : 1;
    std::copy(logits.begin() + r * V, logits.begin() + (r + count) * V, it.b->logits);
    r += count;
  }
  // Engram history: the last `hist` ids of (old history, chunk).
  if (hist > 0) {
    for (Item& it : items) {
      int32_t* h = layout_->engram_history(it.b->request);
      std::vector<int32_t> all(h, h + hist);
      all.insert(all.end(), it.b->tokens, it.b->tokens + it.n);
      std::copy(all.end() - hist, all.end(), h);
    }
  }
}

}  // namespace dsv41rt::model
