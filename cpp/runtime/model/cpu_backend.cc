// The CPU reference backend: every op is the readable FP32 kernel of kernels/cpu, run at once on
// the calling thread (OpenMP inside ops); memory is host memory, and streams, events and graphs
// collapse to nothing. Precision "bf16" is emulated: inputs of BF16-exact matrices are rounded to
// BF16 before the FP32 product, as the GPU's tensor cores see them.
#include <chrono>
#include <cstring>
#include <new>
#include <vector>

#include "core/status.h"
#include "kernels/attention.h"
#include "kernels/attention_cached.h"
#include "kernels/compressor.h"
#include "kernels/engram.h"
#include "kernels/hadamard.h"
#include "kernels/indexer.h"
#include "kernels/indexer_cached.h"
#include "kernels/linear.h"
#include "kernels/mhc.h"
#include "kernels/moe.h"
#include "kernels/paged.h"
#include "kernels/quant.h"
#include "kernels/rms_norm.h"
#include "kernels/rope.h"
#include "kernels/sampling.h"
#include "runtime/model/backend.h"

namespace dsv41rt::model {
namespace {

namespace k = kernels::cpu;
using kernels::RowFormat;

// The host values of the loaded weights, viewed in place (the ModelWeights move into the
// returned storage), with each layer's routed experts stacked as the MoE op takes them.
class CpuWeightView {
 public:
  CpuWeightView(const ModelPlan& plan, ModelWeights& w,
                const std::vector<std::vector<float>>& inv_freq)
      : keep_(std::make_shared<Kept>()) {
    keep_->inv_freq = inv_freq;
    out_.owned.push_back(keep_);
    out_.embed_bf16 = w.embed_bf16;
    out_.embed = w.embed.ptr();
    out_.head = matrix(w.head);
    out_.norm = w.norm.ptr();
    out_.hc_head_fn = floats(w.hc_head_fn), out_.hc_head_base = floats(w.hc_head_base);
    out_.hc_head_scale = floats(w.hc_head_scale);
    for (size_t li = 0; li < plan.layers.size(); ++li) {
      out_.layers.push_back(layer(w.layers[li], li));
    }
    if (w.drafts) drafts(plan, *w.drafts);
    keep_->weights = std::move(w);
  }
  BackendWeights take() { return std::move(out_); }

 private:
  struct Kept {
    ModelWeights weights;
    std::vector<std::vector<float>> inv_freq;
    std::vector<std::vector<float>> stacks;
  };

  // A vector / table read as FP32 values (null when absent), counted in the weight bytes.
  const float* floats(const Tensor& t) {
    out_.bytes += t.numel() * int64_t(sizeof(float)) * !t.empty();
    return t.ptr();
  }
  Matrix matrix(const Tensor& t) {
    if (t.empty()) return {};
    out_.bytes += t.numel() * int64_t(sizeof(float));
    Matrix m{t.ptr(), WeightFormat::kF32, bf16_exact(t)};
    m.fp8_input = fp8_input(t);
    return m;
  }
  // Stacks the experts' matrices (freeing each one's own copy as it goes).
  Matrix stack(std::vector<Tensor>& ts, bool exact, bool fp8) {
    if (ts.empty()) return {};
    std::vector<float> all;
    all.reserve(size_t(ts[0].numel()) * ts.size());
    for (Tensor& t : ts) {
      all.insert(all.end(), t.data.begin(), t.data.end());
      std::vector<float>().swap(t.data);
    }
    out_.bytes += int64_t(all.size() * sizeof(float));
    keep_->stacks.push_back(std::move(all));
    Matrix m{keep_->stacks.back().data(), WeightFormat::kF32, exact};
    m.fp8_input = fp8;
    return m;
  }

  // The DSpark stages as blocks (their RoPE tables follow the backbone's in inv_freq), and the
  // heads beside them.
  void drafts(const ModelPlan& plan, DraftWeights& d) {
    DSV41RT_CHECK_CODE(kInternal,
                       keep_->inv_freq.size() == plan.layers.size() + plan.draft_layers.size(),
                       "the CPU backend needs RoPE tables of the backbone and draft layers");
    for (size_t s = 0; s < d.stages.size(); ++s) {
      out_.drafts.push_back(layer(d.stages[s], plan.layers.size() + s));
    }
    DraftHeadWeights& h = out_.draft_heads;
    h.main_proj = matrix(d.main_proj), h.main_norm = d.main_norm.ptr(), h.norm = d.norm.ptr();
    h.markov_embed = d.markov_embed.ptr(), h.markov_head = matrix(d.markov_head);
    h.confidence = matrix(d.confidence);
    out_.bytes +=
        (d.main_norm.numel() + d.norm.numel() + d.markov_embed.numel()) * int64_t(sizeof(float));
    h.e_proj = matrix(d.e_proj), h.h_proj = matrix(d.h_proj);  // V4 MTP (empty for DSpark)
    h.enorm = floats(d.enorm), h.hnorm = floats(d.hnorm);
    h.hc_head_fn = floats(d.hc_head_fn), h.hc_head_base = floats(d.hc_head_base);
    h.hc_head_scale = floats(d.hc_head_scale);
  }

  // inv_freq index `rope`: the layer's RoPE table.
  LayerWeights layer(BlockWeights& b, size_t rope) {
    LayerWeights L;
    L.attn_norm = b.attn_norm.ptr(), L.ffn_norm = b.ffn_norm.ptr();
    L.hc_attn_fn = b.hc_attn_fn.ptr(), L.hc_attn_base = b.hc_attn_base.ptr();
    L.hc_attn_scale = b.hc_attn_scale.ptr(), L.hc_ffn_fn = b.hc_ffn_fn.ptr();
    L.hc_ffn_base = b.hc_ffn_base.ptr(), L.hc_ffn_scale = b.hc_ffn_scale.ptr();
    const AttentionWeights& a = b.attn;
    L.wq_a = matrix(a.wq_a), L.wq_b = matrix(a.wq_b), L.wkv = matrix(a.wkv);
    L.wo_a = matrix(a.wo_a), L.wo_b = matrix(a.wo_b);
    L.comp_wkv = matrix(a.comp_wkv), L.comp_wgate = matrix(a.comp_wgate);
    L.idx_wq_b = matrix(a.idx_wq_b), L.idx_weights_proj = matrix(a.idx_weights_proj);
    L.idx_wk = matrix(a.idx_wk);
    L.q_norm = a.q_norm.ptr(), L.kv_norm = a.kv_norm.ptr(), L.attn_sink = a.attn_sink.ptr();
    L.comp_norm = a.comp_norm.ptr(), L.idx_k_norm = a.idx_k_norm.ptr();
    L.comp_ape = floats(a.comp_ape);  // V4
    L.idx_comp_wkv = matrix(a.idx_comp_wkv), L.idx_comp_wgate = matrix(a.idx_comp_wgate);
    L.idx_comp_ape = floats(a.idx_comp_ape), L.idx_comp_norm = floats(a.idx_comp_norm);
    L.inv_freq = keep_->inv_freq[rope].data();
    MoeWeights& m = b.moe;
    L.gate = m.gate.ptr(), L.bias = m.bias.ptr();
    L.tid2eid = m.tid2eid.empty() ? nullptr : m.tid2eid.data();
    out_.bytes += int64_t(m.tid2eid.size() * sizeof(int32_t));
    // One precision decision for all six expert matrices (as the GPU, whose MoE op takes one
    // weight format).
    bool exact = bf16_exact(m.shared_w1) && bf16_exact(m.shared_w3) && bf16_exact(m.shared_w2);
    bool fp8 = m.shared_w1.empty() ||
               (fp8_input(m.shared_w1) && fp8_input(m.shared_w3) && fp8_input(m.shared_w2));
    for (size_t e = 0; e < m.w1.size(); ++e) {
      exact = exact && bf16_exact(m.w1[e]) && bf16_exact(m.w3[e]) && bf16_exact(m.w2[e]);
      fp8 = fp8 && fp8_input(m.w1[e]) && fp8_input(m.w3[e]) && fp8_input(m.w2[e]);
    }
    fp8 = fp8 && exact;
    L.expert_begin = m.expert_begin, L.expert_count = int64_t(m.w1.size());
    L.w1 = stack(m.w1, exact, fp8), L.w3 = stack(m.w3, exact, fp8), L.w2 = stack(m.w2, exact, fp8);
    L.shared_w1 = matrix(m.shared_w1), L.shared_w3 = matrix(m.shared_w3);
    L.shared_w2 = matrix(m.shared_w2);
    for (Matrix* s : {&L.shared_w1, &L.shared_w3, &L.shared_w2}) {
      s->bf16_exact = exact, s->fp8_input = fp8;
    }
    if (b.engram) {
      const EngramWeights& e = *b.engram;
      L.engram_table = e.table, L.engram_scale = e.table_scale, L.engram_rows = e.rows;
      L.engram_wkv = matrix(e.wkv);
      L.engram_q = e.q_weight.ptr(), L.engram_k = e.k_weight.ptr();
    }
    return L;
  }

  std::shared_ptr<Kept> keep_;
  BackendWeights out_;
};

class CpuBackend final : public Backend {
 public:
  std::string device() const override { return "cpu"; }

  BackendWeights load_weights(const ModelPlan& plan, ModelWeights& weights,
                              const std::vector<std::vector<float>>& inv_freq) override {
    // Lazy synthetic tensors: this rank's rows generated now, as the host values kept below.
    materialize_host_values(weights);
    DSV41RT_CHECK_CODE(kInternal, !weights.head.data.empty(),
                       "the CPU backend needs weights loaded with host values");
    return CpuWeightView(plan, weights, inv_freq).take();
  }
  std::shared_ptr<void> alloc(int64_t bytes) override {
    uint8_t* p = new (std::nothrow) uint8_t[size_t(std::max<int64_t>(bytes, 1))];
    DSV41RT_CHECK_CODE(kOutOfRange, p != nullptr, "cannot allocate ", bytes, " bytes of memory");
    return std::shared_ptr<void>(p, [](void* q) { delete[] static_cast<uint8_t*>(q); });
  }
  std::shared_ptr<void> alloc_host(int64_t bytes) override { return alloc(bytes); }
  void to_device(void* dst, const void* src, int64_t bytes, Stream) override {
    if (bytes > 0) std::memmove(dst, src, size_t(bytes));
  }
  void to_host(void* dst, const void* src, int64_t bytes, Stream) override {
    if (bytes > 0) std::memmove(dst, src, size_t(bytes));
    d2h_bytes_ += bytes;
  }
  void copy(void* dst, const void* src, int64_t bytes, Stream) override {
    if (bytes > 0) std::memmove(dst, src, size_t(bytes));
  }
  void copy_2d(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch, int64_t row_bytes,
               int64_t rows, Stream) override {
    DSV41RT_CHECK(row_bytes >= 0 && rows >= 0 && dst_pitch >= row_bytes && src_pitch >= row_bytes,
                  "copy_2d: ", rows, " rows of ", row_bytes, " bytes with pitches ", dst_pitch,
                  " / ", src_pitch);
    for (int64_t r = 0; r < rows && row_bytes > 0; ++r) {
      std::memmove(static_cast<uint8_t*>(dst) + r * dst_pitch,
                   static_cast<const uint8_t*>(src) + r * src_pitch, size_t(row_bytes));
    }
  }
  void fill(void* dst, uint8_t byte, int64_t bytes, Stream) override {
    if (bytes > 0) std::memset(dst, byte, size_t(bytes));
  }
  void synchronize(Stream) override {}

  Stream stream(int) override { return {}; }
  void record(int, Stream) override {}
  void wait(Stream, int) override {}
  // Ops run as they are called, so the host clock at the marker is the time.
  void record_time(int id, Stream) override { times_[id] = std::chrono::steady_clock::now(); }
  double elapsed_ms(int from_id, int to_id) override {
    return std::chrono::duration<double, std::milli>(times_.at(to_id) - times_.at(from_id)).count();
  }
  std::map<std::string, int64_t> stats() const override { return {{"d2h_bytes", d2h_bytes_}}; }

  void set_tensor_cores(bool on) override { tc_ = on; }
  void set_fp8_activations(bool on) override { fp8_ = on; }

  void linear(const float* x, const Matrix& w, int64_t m, int64_t kk, int64_t n, float* y,
              bool accumulate, Stream) override {
    std::vector<float> buf;
    k::linear(emulated(x, m, kk, w), dense(w, n, kk, buf), m, kk, n, y, accumulate);
  }
  void grouped_linear(const float* x, const Matrix& w, int64_t m, int64_t groups, int64_t kk,
                      int64_t n, float* y, Stream) override {
    std::vector<float> buf;
    k::grouped_linear(emulated(x, m * groups, kk, w), dense(w, groups * n, kk, buf), m, groups, kk,
                      n, y);
  }
  void rms_norm(const float* x, const float* weight, int64_t rows, int64_t dim, float eps, float* y,
                Stream) override {
    k::rms_norm(x, weight, rows, dim, eps, y);
  }
  void apply_rope(float* x, int64_t rows, int64_t heads, int64_t head_dim, int64_t rope_dim,
                  const int64_t* positions, const float* inv_freq, bool inverse, Stream) override {
    k::apply_rope(x, rows, heads, head_dim, rope_dim, positions, inv_freq, inverse);
  }
  void hc_mix(const float* X, const float* fn, const float* base, const float* scale, int64_t S,
              int64_t n, int64_t H, float rms_eps, float hc_eps, int iters, float* pre, float* post,
              float* comb, Scratch, Stream) override {
    k::hc_mix(X, fn, base, scale, S, n, H, rms_eps, hc_eps, iters, pre, post, comb);
  }
  void hc_collapse(const float* X, const float* w, int64_t S, int64_t n, int64_t H, float* u,
                   Stream) override {
    k::hc_collapse(X, w, S, n, H, u);
  }
  void hc_head_pre(const float* X, const float* fn, const float* base, const float* scale,
                   int64_t S, int64_t n, int64_t H, float rms_eps, float hc_eps, float* pre,
                   Stream) override {
    k::hc_head_pre(X, fn, base, scale, S, n, H, rms_eps, hc_eps, pre);
  }
  void hc_expand(const float* X, const float* y, const float* post, const float* comb, int64_t S,
                 int64_t n, int64_t H, float* out, Stream) override {
    k::hc_expand(X, y, post, comb, S, n, H, out);
  }
  void embed_rows(const float* table_f32, const uint16_t* table_bf16, const int32_t* tokens,
                  int64_t n, int64_t H, int64_t copies, float* X, Stream) override {
    k::embed_rows(table_f32, table_bf16, tokens, n, H, copies, X);
  }
  void engram_gather(const uint8_t* table, const uint8_t* scales, const int64_t* rows, int64_t n,
                     int64_t hd, float* out, Stream) override {
    k::engram_gather(table, scales, rows, n, hd, out);
  }
  // The CPU maps every weight as FP32 host values (the precision modes' emulation: emb holds
  // decoded FP8 table rows, exact in BF16 and in FP8 1 x 32 blocks, so no mode rounds it).
  void engram_forward(float* X, const float* emb, const Matrix& wkv, const float* q_weight,
                      const float* k_weight, int64_t S, int64_t n, int64_t H, int64_t D, float eps,
                      Scratch, Stream) override {
    const kernels::WeightView v = wkv.view((n + 1) * H, D);
    DSV41RT_CHECK_CODE(kUnsupported, v.format == WeightFormat::kF32,
                       "the CPU Engram projection reads FP32 weights");
    k::engram_forward(X, emb, static_cast<const float*>(v.data), q_weight, k_weight, nullptr, S, n,
                      H, D, eps);
  }
  void moe_route(const float* x, const float* gate, const float* bias, int64_t S, int64_t H,
                 int64_t E, int64_t kk, float scale, bool normalize, int32_t* idx, float* weight,
                 Stream) override {
    k::moe_route(x, gate, bias, S, H, E, kk, scale, idx, weight, normalize);
  }
  void moe_route_hash(const float* x, const float* gate, const int32_t* tid2eid,
                      const int32_t* tokens, int64_t S, int64_t H, int64_t E, int64_t kk,
                      int64_t vocab, float scale, int32_t* idx, float* weight, Stream) override {
    DSV41RT_CHECK(tokens || S == 0, "moe_route_hash: null tokens");
    const std::vector<int64_t> ids(tokens, tokens + std::max<int64_t>(S, 0));  // the op's int64
    k::moe_route_hash(x, gate, tid2eid, ids.data(), S, H, E, kk, vocab, scale, idx, weight);
  }
  void moe_experts(const float* x, const int32_t* idx, const float* weight, int64_t S, int64_t H,
                   int64_t kk, int64_t E, int64_t I, const LayerWeights& w, float limit, float* y,
                   Scratch, Stream) override {
    DSV41RT_CHECK_CODE(kInternal,
                       w.expert_begin == 0 && (w.expert_count == 0 || w.expert_count == E),
                       "moe_experts on an expert-parallel shard (use moe_expert_slots)");
    ExpertViews v(w, E, H, I);
    k::moe_forward(x, idx, weight, S, H, kk, E, I, v.experts.data(), v.shared_or_null(), I, limit,
                   y, moe_inputs(w));
  }
  void moe_local_ids(const int32_t* idx, int64_t n, int64_t begin, int64_t count, int32_t* out,
                     Stream) override {
    k::moe_local_ids(idx, n, begin, count, out);
  }
  void moe_expert_slots(const float* x, const int32_t* idx, const float* weight, int64_t S,
                        int64_t H, int64_t kk, int64_t E, int64_t I, const LayerWeights& w,
                        float limit, float* slots, Scratch, Stream) override {
    const int64_t count = w.expert_count > 0 ? w.expert_count : E;
    ExpertViews v(w, count, H, I);
    k::moe_slots(x, idx, weight, S, H, kk, E, I, v.experts.data(), w.expert_begin, count, limit,
                 slots, moe_inputs(w));
  }
  void moe_combine(const float* x, const int32_t* idx, const float* slots, int64_t S, int64_t H,
                   int64_t kk, int64_t I, const LayerWeights& w, float limit, float* y, Scratch,
                   Stream) override {
    ExpertViews v(w, 0, H, I);
    k::moe_combine(x, idx, slots, S, H, kk, v.shared_or_null(), I, limit, y, moe_inputs(w));
  }
  void cache_qdq(RowFormat f, float* x, int64_t rows, int64_t dim, Stream) override {
    if (f == RowFormat::kFp8Window) k::fp8_window_qdq(x, rows, dim, x);
    if (f == RowFormat::kNvfp4) k::nvfp4_qdq(x, rows, dim, x);
    if (f == RowFormat::kMxfp4) k::mxfp4_qdq(x, rows, dim, x);
    if (f == RowFormat::kV4Row) k::v4_row_qdq(x, rows, dim, x);
  }
  void unpack_paged(RowFormat f, const kernels::PagedRows& src, int64_t dim, int64_t items,
                    int64_t max_count, const int64_t* count, const int64_t* out_offset, float* out,
                    Stream) override {
    k::unpack_paged(f, src, dim, items, max_count, count, out_offset, out);
  }
  void pack_paged(RowFormat f, const kernels::PagedRows& dst, int64_t dim, int64_t n,
                  const float* rows, const int32_t* item, const int64_t* entry, Stream) override {
    k::pack_paged(f, dst, dim, n, rows, item, entry);
  }
  void unpack_ring(RowFormat f, const kernels::RingRows& src, int64_t dim, int64_t items,
                   int64_t max_count, const int64_t* first, const int64_t* count,
                   const int64_t* out_offset, float* out, Stream) override {
    k::unpack_ring(f, src, dim, items, max_count, first, count, out_offset, out);
  }
  void pack_ring(RowFormat f, const kernels::RingRows& dst, int64_t dim, int64_t n,
                 const float* rows, const int32_t* item, const int64_t* positions,
                 const uint8_t* store, Stream) override {
    k::pack_ring(f, dst, dim, n, rows, item, positions, store);
  }
  void compress_pool_gather(const float* values, const float* scores, uint8_t* const* slots,
                            int64_t pending_offset, int64_t groups, int64_t ratio, int64_t D,
                            const int32_t* group_item, const int64_t* n_pending,
                            const int64_t* first_row, float* pooled, Stream) override {
    k::compress_pool_gather(values, scores, slots, pending_offset, groups, ratio, D, group_item,
                            n_pending, first_row, pooled);
  }
  void store_pending(const float* values, const float* scores, uint8_t* const* slots,
                     int64_t pending_offset, int64_t ratio, int64_t D, int64_t n,
                     const int32_t* item, const int64_t* src_row, const int64_t* dst_row,
                     Stream) override {
    k::store_pending(values, scores, slots, pending_offset, ratio, D, n, item, src_row, dst_row);
  }
  void v4_compress(const kernels::V4CompressorWeights& w, const float* a, const float* s,
                   uint8_t* const* slots, int64_t state_offset, int64_t items,
                   const int64_t* length, const int64_t* row0, const int64_t* n,
                   const int64_t* entry0, float* entries, Stream) override {
    k::v4_compress_paged(w, a, s, slots, state_offset, items, length, row0, n, entry0, entries);
  }
  bool has_v4_ops() const override { return true; }
  void attention_indices(int64_t S, int64_t W, int64_t KI, const int32_t* row_item,
                         const int64_t* positions, const int64_t* window_first,
                         const int64_t* length, const int64_t* old_offset, const int64_t* row0,
                         int64_t new_offset, const int32_t* topk, const int64_t* comp_offset,
                         int64_t comp_base, int32_t* idx, Stream) override {
    k::attention_indices(S, W, KI, row_item, positions, window_first, length, old_offset, row0,
                         new_offset, topk, comp_offset, comp_base, idx);
  }
  void indexer_scores(const float* q, const float* keys, const int64_t* key_offset, const float* w,
                      const int64_t* n_visible, int64_t S, int64_t H, int64_t D, int64_t T,
                      bool /*values_bf16*/, float* scores, Stream) override {
    k::indexer_scores_offset(q, keys, key_offset, w, n_visible, S, H, D, T, scores);
  }
  void candidate_blocks(const float* scores, const int64_t* n_visible, int64_t S, int64_t T,
                        int64_t topk_blocks, int64_t block_size, uint8_t* mask, Stream) override {
    k::candidate_blocks(scores, n_visible, S, T, topk_blocks, block_size, mask);
  }
  void apply_candidate_mask(float* scores, const uint8_t* mask, int64_t n, Stream) override {
    k::apply_candidate_mask(scores, mask, 1, n);
  }
  void topk_select(const float* scores, int64_t S, int64_t T, int64_t kk, int32_t* idx,
                   Stream) override {
    k::topk_select(scores, S, T, kk, idx);
  }
  void visible_entries(const int64_t* n_visible, int64_t S, int64_t kk, int32_t* idx,
                       Stream) override {
    k::visible_entries(n_visible, S, kk, idx);
  }
  void walsh_hadamard(const float* x, int64_t rows, int64_t dim, float* y, Stream) override {
    if (rows > 0) k::walsh_hadamard(x, rows, dim, y);
  }
  void sparse_attention(const float* q, const float* kv_a, int64_t T_a, const float* kv_b,
                        int64_t T_b, const int32_t* idx, const float* sink, int64_t S,
                        int64_t n_heads, int64_t D, int64_t K, float scale, bool /*keys_bf16*/,
                        float* out, Stream) override {
    k::sparse_attention_split(q, kv_a, T_a, kv_b, T_b, idx, sink, S, n_heads, D, K, scale, out);
  }
  // Decode-sized forwards (kDecodeForwardRows, the CUDA backend's rule) read the caches in place,
  // so the CPU runs, and CI tests, the runner's in-place data flow too.
  void set_forward_rows(int64_t rows, bool decode_batch) override {
    decode_like_ = rows <= kDecodeForwardRows || decode_batch;
  }
  bool attention_reads_caches(bool /*keys_bf16*/, int64_t /*D*/) const override {
    return decode_like_;
  }
  void sparse_attention_cached(const float* q, const kernels::CachedKeys& keys, const int32_t* idx,
                               const float* sink, int64_t S, int64_t n_heads, int64_t D, int64_t K,
                               float scale, float* out, Stream) override {
    k::sparse_attention_cached(q, keys, idx, sink, S, n_heads, D, K, scale, out);
  }
  bool indexer_reads_caches(kernels::RowFormat, int64_t, int64_t) const override {
    return decode_like_;
  }
  void indexer_scores_cached(const float* q, const kernels::IndexKeys& keys, const float* w,
                             const int64_t* n_visible, int64_t S, int64_t H, int64_t D, int64_t T,
                             float* scores, Stream) override {
    k::indexer_scores_cached(q, keys, w, n_visible, S, H, D, T, scores);
  }
  void gather_rows(const float* src, const int64_t* rows, int64_t n, int64_t dim, float* dst,
                   Stream) override {
    k::gather_rows(src, rows, n, dim, dst);
  }
  void scale(float* x, int64_t n, float factor, Stream) override { k::scale_inplace(x, n, factor); }
  void mask_tokens(float* logits, const int64_t* rows, int64_t n, int64_t V, const uint32_t* words,
                   Stream) override {
    k::mask_tokens(logits, rows, n, V, words);
  }
  void sample(const float* logits, const int64_t* logit_rows, int64_t rows, int64_t V,
              const kernels::SamplingParams* params, const int32_t* history,
              const int64_t* prompt_off, const int64_t* output_off, const uint64_t* steps,
              int32_t* tokens, float* logprobs, int32_t max_top, int32_t* top_ids,
              float* top_logprobs, Scratch, Stream) override {
    for (int64_t r = 0; r < rows; ++r) {
      const kernels::SampledToken t =
          k::sample_token(logits + logit_rows[r] * V, V, params[r], history + prompt_off[r],
                          prompt_off[r + 1] - prompt_off[r], history + output_off[r],
                          output_off[r + 1] - output_off[r], steps[r]);
      tokens[r] = t.token;
      logprobs[r] = t.logprob;
      for (size_t j = 0; j < t.top_ids.size() && int32_t(j) < max_top; ++j) {
        top_ids[r * max_top + int64_t(j)] = t.top_ids[j];
        top_logprobs[r * max_top + int64_t(j)] = t.top_logprobs[j];
      }
    }
  }

 private:
  // FP32 values of a matrix read as [rows, cols]: the weights this backend loads are FP32
  // already; other stored formats (op tests hand both backends one Matrix) are decoded into buf.
  // The FP32 views of a layer's first `count` stacked routed experts and its shared expert.
  struct ExpertViews {
    ExpertViews(const LayerWeights& w, int64_t count, int64_t H, int64_t I)
        : experts(static_cast<size_t>(count)) {
      if (count > 0) {
        const float* w1 = dense(w.w1, count * I, H, b1);
        const float* w3 = dense(w.w3, count * I, H, b3);
        const float* w2 = dense(w.w2, count * H, I, b2);
        for (int64_t e = 0; e < count; ++e) {
          experts[e] = {w1 + e * I * H, w3 + e * I * H, w2 + e * H * I};
        }
      }
      if (w.shared_w1) {
        shared = {dense(w.shared_w1, I, H, s1), dense(w.shared_w3, I, H, s3),
                  dense(w.shared_w2, H, I, s2)};
      }
    }
    const kernels::SwigluWeights* shared_or_null() const { return shared.w1 ? &shared : nullptr; }
    std::vector<float> b1, b3, b2, s1, s3, s2;
    std::vector<kernels::SwigluWeights> experts;
    kernels::SwigluWeights shared{};
  };
  // One GEMM-input decision for all of a layer's expert matrices (as the GPU's MoE op).
  kernels::cpu::GemmInputs moe_inputs(const LayerWeights& w) const {
    if (!tc_ || !moe_bf16_exact(w)) return kernels::cpu::GemmInputs::kFp32;
    return fp8_ && moe_fp8_inputs(w) ? kernels::cpu::GemmInputs::kFp8
                                     : kernels::cpu::GemmInputs::kBf16;
  }
  static const float* dense(const Matrix& w, int64_t rows, int64_t cols, std::vector<float>& buf) {
    const kernels::WeightView v = w.view(rows, cols);
    if (v.format == WeightFormat::kF32) return static_cast<const float*>(v.data);
    buf.resize(size_t(rows * cols));
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) buf[size_t(r * cols + c)] = v.value(r, c);
    }
    return buf.data();
  }
  // The activations [rows, k] a GEMM sees in the emulated tensor-core modes: rounded to BF16, or
  // (precision "fp8", FP8 / FP4 matrices) quantised to FP8 in 1 x 32 blocks along k.
  const float* emulated(const float* x, int64_t rows, int64_t kk, const Matrix& w) {
    if (!tc_ || !w.bf16_exact) return x;
    rounded_.assign(x, x + rows * kk);
    const bool fp8 = fp8_ && w.fp8_input;
    k::round_gemm_inputs(rounded_.data(), rows, kk,
                         fp8 ? k::GemmInputs::kFp8 : k::GemmInputs::kBf16);
    return rounded_.data();
  }

  bool tc_ = false, fp8_ = false, decode_like_ = false;
  std::vector<float> rounded_;
  int64_t d2h_bytes_ = 0;
  std::map<int, std::chrono::steady_clock::time_point> times_;
};

}  // namespace

std::unique_ptr<BackendGraph> Backend::capture(Stream, const std::function<void()>&,
                                               std::unique_ptr<BackendGraph>) {
  DSV41RT_THROW_CODE(kUnsupported, "the ", device(), " backend has no graphs");
}
void Backend::replay(BackendGraph&, Stream) {
  DSV41RT_THROW_CODE(kUnsupported, "the ", device(), " backend has no graphs");
}
void Backend::hc_head_pre(const float*, const float*, const float*, const float*, int64_t, int64_t,
                          int64_t, float, float, float*, Stream) {
  DSV41RT_THROW_CODE(kUnsupported,
                     "hc_head_pre (the DeepSeek-V4 hyper-head) is not implemented by the ",
                     device(), " backend");
}
void Backend::moe_route_hash(const float*, const float*, const int32_t*, const int32_t*, int64_t,
                             int64_t, int64_t, int64_t, int64_t, float, int32_t*, float*, Stream) {
  DSV41RT_THROW_CODE(kUnsupported,
                     "moe_route_hash (DeepSeek-V4 hash routing) is not implemented "
                     "by the ",
                     device(), " backend");
}
void Backend::walsh_hadamard(const float*, int64_t, int64_t, float*, Stream) {
  DSV41RT_THROW_CODE(kUnsupported,
                     "walsh_hadamard (DeepSeek-V4's indexer rotation, quantised caches) is not "
                     "implemented by the ",
                     device(), " backend");
}
void Backend::visible_entries(const int64_t*, int64_t, int64_t, int32_t*, Stream) {
  DSV41RT_THROW_CODE(kUnsupported,
                     "visible_entries (DeepSeek-V4 HCA selection) is not implemented "
                     "by the ",
                     device(), " backend");
}
void Backend::v4_compress(const kernels::V4CompressorWeights&, const float*, const float*,
                          uint8_t* const*, int64_t, int64_t, const int64_t*, const int64_t*,
                          const int64_t*, const int64_t*, float*, Stream) {
  DSV41RT_THROW_CODE(kUnsupported,
                     "v4_compress (the DeepSeek-V4 compressor) is not implemented "
                     "by the ",
                     device(), " backend");
}

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

#if !DSV41RT_WITH_CUDA
std::unique_ptr<Backend> make_cuda_backend(const std::string& device) {
  DSV41RT_THROW_CODE(kInvalidArgument, "device '", device,
                     "': this build of dsv41rt has no CUDA backend (configure with nvcc "
                     "available and DSV41RT_WITH_CUDA=ON)");
}
#endif

}  // namespace dsv41rt::model
