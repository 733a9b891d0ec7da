#include "runtime/model/cuda_weights.h"

#include "runtime/model/cuda_resources.h"

namespace dsv41rt::model {

namespace {

class Uploader {
 public:
  explicit Uploader(CudaModelWeights& out) : out_(out) {}

  template <typename T>
  const T* raw(const T* host, int64_t n) {
    if (host == nullptr || n == 0) return nullptr;
    std::shared_ptr<void> mem = cudart::device_alloc(n * int64_t(sizeof(T)));
    DSV41RT_CU(cudaMemcpy(mem.get(), host, size_t(n) * sizeof(T), cudaMemcpyHostToDevice));
    out_.owned.push_back(mem);
    out_.bytes += n * int64_t(sizeof(T));
    return static_cast<const T*>(mem.get());
  }
  const float* f32(const Tensor& t) { return raw(t.ptr(), int64_t(t.data.size())); }
  const float* f32(const std::vector<float>& v) { return raw(v.data(), int64_t(v.size())); }
  /// Experts stacked in id order (all the same shape).
  const float* stacked(const std::vector<Tensor>& experts) {
    if (experts.empty()) return nullptr;
    std::vector<float> all;
    all.reserve(experts.size() * experts[0].data.size());
    for (const Tensor& t : experts) all.insert(all.end(), t.data.begin(), t.data.end());
    return f32(all);
  }

 private:
  CudaModelWeights& out_;
};

}  // namespace

CudaModelWeights upload_weights(const ModelPlan& plan, const ModelWeights& w,
                                const std::vector<std::vector<float>>& inv_freq) {
  const ModelConfig& c = plan.config;
  CudaModelWeights d;
  Uploader up(d);
  if (w.embed_bf16) {
    d.embed_bf16 = up.raw(w.embed_bf16, c.vocab_size * c.hidden_size);
  } else {
    d.embed = up.f32(w.embed);
  }
  d.head = up.f32(w.head);
  d.norm = up.f32(w.norm);
  for (size_t li = 0; li < plan.layers.size(); ++li) {
    const BlockWeights& b = w.layers[li];
    CudaLayerWeights L;
    L.attn_norm = up.f32(b.attn_norm);
    L.ffn_norm = up.f32(b.ffn_norm);
    L.hc_attn_fn = up.f32(b.hc_attn_fn);
    L.hc_attn_base = up.f32(b.hc_attn_base);
    L.hc_attn_scale = up.f32(b.hc_attn_scale);
    L.hc_ffn_fn = up.f32(b.hc_ffn_fn);
    L.hc_ffn_base = up.f32(b.hc_ffn_base);
    L.hc_ffn_scale = up.f32(b.hc_ffn_scale);
    const AttentionWeights& a = b.attn;
    L.wq_a = up.f32(a.wq_a);
    L.q_norm = up.f32(a.q_norm);
    L.wq_b = up.f32(a.wq_b);
    L.wkv = up.f32(a.wkv);
    L.kv_norm = up.f32(a.kv_norm);
    L.wo_a = up.f32(a.wo_a);
    L.wo_b = up.f32(a.wo_b);
    L.attn_sink = up.f32(a.attn_sink);
    L.comp_wkv = up.f32(a.comp_wkv);
    L.comp_wgate = up.f32(a.comp_wgate);
    L.comp_norm = up.f32(a.comp_norm);
    L.idx_wq_b = up.f32(a.idx_wq_b);
    L.idx_weights_proj = up.f32(a.idx_weights_proj);
    L.idx_wk = up.f32(a.idx_wk);
    L.idx_k_norm = up.f32(a.idx_k_norm);
    L.inv_freq = up.f32(inv_freq[li]);
    const MoeWeights& m = b.moe;
    L.gate = up.f32(m.gate);
    L.bias = up.f32(m.bias);
    L.w1 = up.stacked(m.w1);
    L.w3 = up.stacked(m.w3);
    L.w2 = up.stacked(m.w2);
    L.shared_w1 = up.f32(m.shared_w1);
    L.shared_w3 = up.f32(m.shared_w3);
    L.shared_w2 = up.f32(m.shared_w2);
    if (b.engram) {
      const EngramWeights& e = *b.engram;
      const int64_t hd = c.engram->head_dim;
      L.engram_table = up.raw(e.table, e.rows * hd);
      L.engram_scale = up.raw(e.table_scale, e.rows * (hd / 32));
      L.engram_rows = e.rows;
      L.engram_wkv = up.f32(e.wkv);
      L.engram_q = up.f32(e.q_weight);
      L.engram_k = up.f32(e.k_weight);
    }
    d.layers.push_back(L);
  }
  return d;
}

}  // namespace dsv41rt::model
