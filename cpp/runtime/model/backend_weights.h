// The model's weights as a backend stores them (host memory on the CPU, device memory on CUDA):
// raw pointers the model runner hands to the backend's ops, plus the storage that keeps them
// alive. Built once at load by Backend::load_weights from the validated ModelWeights.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace dsv41rt::model {

/// Storage of a weight matrix [rows, cols] (row = output channel), chosen by the backend.
enum class WeightFormat : int {
  kF32 = 0,   ///< FP32 values
  kBF16 = 1,  ///< BF16 bits (exact for the checkpoint's FP8 / FP4 / BF16 values)
};

/// A weight matrix (or a stack of them, e.g. [E, I, H] experts) on the backend.
struct Matrix {
  const void *data = nullptr;
  WeightFormat format = WeightFormat::kF32;
  /// The values are exactly representable in BF16 (the checkpoint stores them FP8 / FP4 / BF16):
  /// precision "bf16" puts such matrices on tensor cores (the CPU emulates it by rounding the
  /// activations); the others stay FP32.
  bool bf16_exact = false;
  explicit operator bool() const { return data != nullptr; }
};

struct LayerWeights {
  const float *attn_norm = nullptr, *ffn_norm = nullptr;
  const float *hc_attn_fn = nullptr, *hc_attn_base = nullptr, *hc_attn_scale = nullptr;
  const float *hc_ffn_fn = nullptr, *hc_ffn_base = nullptr, *hc_ffn_scale = nullptr;
  // attention
  Matrix wq_a, wq_b, wkv, wo_a, wo_b, comp_wkv, comp_wgate, idx_wq_b, idx_weights_proj, idx_wk;
  const float *q_norm = nullptr, *kv_norm = nullptr, *attn_sink = nullptr, *comp_norm = nullptr,
              *idx_k_norm = nullptr;
  const float *inv_freq = nullptr;  ///< RoPE inverse frequencies of this layer
  // MoE: routed experts stacked [E, I, H] / [E, H, I]; all six matrices share one format
  const float *gate = nullptr, *bias = nullptr;
  Matrix w1, w3, w2, shared_w1, shared_w3, shared_w2;
  // Engram: FP8 E4M3 table [rows, head_dim] with UE8M0 scales [rows, head_dim / 32]
  const uint8_t *engram_table = nullptr, *engram_scale = nullptr;
  int64_t engram_rows = 0;
  const float *engram_wkv = nullptr, *engram_q = nullptr, *engram_k = nullptr;
};

struct BackendWeights {
  const float *embed = nullptr;          ///< [V, H] FP32, or
  const uint16_t *embed_bf16 = nullptr;  ///< [V, H] BF16 as stored
  Matrix head;
  const float *norm = nullptr;
  std::vector<LayerWeights> layers;
  int64_t bytes = 0;                         ///< backend memory held by the weights
  std::vector<std::shared_ptr<void>> owned;  ///< keeps the storage alive
};

}  // namespace dsv41rt::model
