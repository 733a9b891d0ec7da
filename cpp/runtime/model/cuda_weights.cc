#include "runtime/model/cuda_weights.h"

#include "kernels/cuda/quant.cuh"
#include "runtime/model/cuda_resources.h"
#include "runtime/model/device_array.h"

namespace dsv41rt::model {

namespace {

/// Every tensor is loaded without host values and stored in a format BF16 holds exactly.
bool all_bf16_exact(const std::vector<const Tensor*>& ts) {
  for (const Tensor* t : ts) {
    if (!t->data.empty() || !bf16_exact(*t)) return false;
  }
  return true;
}

class Uploader {
 public:
  explicit Uploader(BackendWeights& out) : out_(out) {}

  template <typename T>
  T* alloc(int64_t n) {
    if (n == 0) return nullptr;
    std::shared_ptr<void> mem = cudart::device_alloc(n * int64_t(sizeof(T)));
    out_.owned.push_back(mem);
    out_.bytes += n * int64_t(sizeof(T));
    return static_cast<T*>(mem.get());
  }
  template <typename T>
  const T* raw(const T* host, int64_t n) {
    if (host == nullptr || n == 0) return nullptr;
    T* d = alloc<T>(n);
    DSV41RT_CU(cudaMemcpy(d, host, size_t(n) * sizeof(T), cudaMemcpyHostToDevice));
    return d;
  }
  /// FP32 values (vectors and small tensors; decoded on the host when loaded lazily).
  const float* f32(const Tensor& t) {
    if (t.empty()) return nullptr;
    const std::vector<float> v = host_values(t);
    return raw(v.data(), int64_t(v.size()));
  }
  const float* f32(const std::vector<float>& v) { return raw(v.data(), int64_t(v.size())); }

  /// Matrices stacked along a new leading axis, BF16 when every source is BF16-exact and has no
  /// host values, FP32 otherwise.
  Matrix matrices(const std::vector<const Tensor*>& ts) {
    if (ts.empty() || ts[0]->empty()) return {};
    if (!all_bf16_exact(ts)) return f32_matrices(ts);
    const int64_t each = ts[0]->numel();
    uint16_t* d = alloc<uint16_t>(each * int64_t(ts.size()));
    for (size_t i = 0; i < ts.size(); ++i) to_bf16(*ts[i], d + i * each);
    DSV41RT_CU(cudaDeviceSynchronize());  // the staging buffer is reused by the next call
    return {d, WeightFormat::kBF16, true};
  }
  Matrix matrix(const Tensor& t) { return matrices({&t}); }
  /// FP32 stack whatever the sources (to match another matrix's precision).
  Matrix f32_matrices(const std::vector<const Tensor*>& ts) {
    if (ts.empty() || ts[0]->empty()) return {};
    const int64_t each = ts[0]->numel();
    float* d = alloc<float>(each * int64_t(ts.size()));
    for (size_t i = 0; i < ts.size(); ++i) {
      const std::vector<float> v = host_values(*ts[i]);
      DSV41RT_CU(
          cudaMemcpy(d + i * each, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice));
    }
    return {d, WeightFormat::kF32, false};
  }

 private:
  // Raw bytes (and scales) to a device staging area, dequantised there into `out`.
  void to_bf16(const Tensor& t, uint16_t* out) {
    const TensorSource& s = t.source;
    const int64_t n = t.numel();
    if (s.dtype == DType::kBF16) {
      DSV41RT_CU(cudaMemcpy(out, s.data, size_t(n) * 2, cudaMemcpyHostToDevice));
      return;
    }
    const bool fp8 = s.dtype == DType::kFP8E4M3;
    const int64_t data_bytes = fp8 ? n : n / 2;
    const int64_t scale_bytes = fp8 ? ((s.rows + s.block_rows - 1) / s.block_rows) *
                                          ((s.cols + s.block_cols - 1) / s.block_cols)
                                    : s.rows * ((s.cols + 31) / 32);
    DSV41RT_CU(cudaDeviceSynchronize());  // the previous dequantisation has read the staging
    uint8_t* stage = staging_.ensure([](int64_t b) { return cudart::device_alloc(b); },
                                     data_bytes + scale_bytes, staging_generation_);
    DSV41RT_CU(cudaMemcpy(stage, s.data, size_t(data_bytes), cudaMemcpyHostToDevice));
    DSV41RT_CU(
        cudaMemcpy(stage + data_bytes, s.scale, size_t(scale_bytes), cudaMemcpyHostToDevice));
    if (fp8) {
      DSV41RT_CU(kernels::cuda::dequant_fp8_blocks_bf16(stage, stage + data_bytes, s.rows, s.cols,
                                                        s.block_rows, s.block_cols, out, nullptr));
    } else {
      DSV41RT_CU(kernels::cuda::dequant_fp4_rows_bf16(stage, stage + data_bytes, s.rows, s.cols,
                                                      out, nullptr));
    }
  }

  BackendWeights& out_;
  DeviceArray<uint8_t> staging_;
  uint64_t staging_generation_ = 0;
};

}  // namespace

BackendWeights upload_weights(const ModelPlan& plan, const ModelWeights& w,
                              const std::vector<std::vector<float>>& inv_freq) {
  const ModelConfig& c = plan.config;
  BackendWeights d;
  Uploader up(d);
  if (w.embed_bf16) {
    d.embed_bf16 = up.raw(w.embed_bf16, c.vocab_size * c.hidden_size);
  } else {
    d.embed = up.f32(w.embed);
  }
  d.head = up.matrix(w.head);
  d.norm = up.f32(w.norm);
  for (size_t li = 0; li < plan.layers.size(); ++li) {
    const BlockWeights& b = w.layers[li];
    LayerWeights L;
    L.attn_norm = up.f32(b.attn_norm);
    L.ffn_norm = up.f32(b.ffn_norm);
    L.hc_attn_fn = up.f32(b.hc_attn_fn);
    L.hc_attn_base = up.f32(b.hc_attn_base);
    L.hc_attn_scale = up.f32(b.hc_attn_scale);
    L.hc_ffn_fn = up.f32(b.hc_ffn_fn);
    L.hc_ffn_base = up.f32(b.hc_ffn_base);
    L.hc_ffn_scale = up.f32(b.hc_ffn_scale);
    const AttentionWeights& a = b.attn;
    L.wq_a = up.matrix(a.wq_a);
    L.q_norm = up.f32(a.q_norm);
    L.wq_b = up.matrix(a.wq_b);
    L.wkv = up.matrix(a.wkv);
    L.kv_norm = up.f32(a.kv_norm);
    L.wo_a = up.matrix(a.wo_a);
    L.wo_b = up.matrix(a.wo_b);
    L.attn_sink = up.f32(a.attn_sink);
    L.comp_wkv = up.matrix(a.comp_wkv);
    L.comp_wgate = up.matrix(a.comp_wgate);
    L.comp_norm = up.f32(a.comp_norm);
    L.idx_wq_b = up.matrix(a.idx_wq_b);
    L.idx_weights_proj = up.matrix(a.idx_weights_proj);
    L.idx_wk = up.matrix(a.idx_wk);
    L.idx_k_norm = up.f32(a.idx_k_norm);
    L.inv_freq = up.f32(inv_freq[li]);
    const MoeWeights& m = b.moe;
    L.gate = up.f32(m.gate);
    L.bias = up.f32(m.bias);
    // One precision for all six expert matrices (the MoE kernel takes one weight type).
    std::vector<const Tensor*> all;
    for (const auto* group : {&m.w1, &m.w3, &m.w2}) {
      for (const Tensor& t : *group) all.push_back(&t);
    }
    for (const Tensor* t : {&m.shared_w1, &m.shared_w3, &m.shared_w2}) all.push_back(t);
    const bool bf16 = all_bf16_exact(all);
    auto stack = [&](const std::vector<Tensor>& ts) {
      std::vector<const Tensor*> p;
      for (const Tensor& t : ts) p.push_back(&t);
      return p;
    };
    if (bf16) {
      L.w1 = up.matrices(stack(m.w1));
      L.w3 = up.matrices(stack(m.w3));
      L.w2 = up.matrices(stack(m.w2));
      L.shared_w1 = up.matrix(m.shared_w1);
      L.shared_w3 = up.matrix(m.shared_w3);
      L.shared_w2 = up.matrix(m.shared_w2);
    } else {
      L.w1 = up.f32_matrices(stack(m.w1));
      L.w3 = up.f32_matrices(stack(m.w3));
      L.w2 = up.f32_matrices(stack(m.w2));
      L.shared_w1 = up.f32_matrices({&m.shared_w1});
      L.shared_w3 = up.f32_matrices({&m.shared_w3});
      L.shared_w2 = up.f32_matrices({&m.shared_w2});
    }
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
