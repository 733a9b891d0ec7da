// Device copies of the model weights for the CUDA executor: FP32 arrays uploaded from the
// loaded ModelWeights (the same values the CPU reference uses), routed experts stacked per layer
// ([E, I, H] / [E, H, I]) for the MoE kernels, Engram tables uploaded raw (FP8 + UE8M0 scales).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/model/weights.h"

namespace dsv41rt::model {

/// A weight matrix on the device: BF16 bits when the checkpoint stores it FP8 / FP4 / BF16 (all
/// exact in BF16), FP32 otherwise. The linear and MoE kernels take either (same results).
struct DevMatrix {
  const void* ptr = nullptr;
  bool bf16 = false;
  explicit operator bool() const { return ptr != nullptr; }
};

struct CudaLayerWeights {
  const float *attn_norm = nullptr, *ffn_norm = nullptr;
  const float *hc_attn_fn = nullptr, *hc_attn_base = nullptr, *hc_attn_scale = nullptr;
  const float *hc_ffn_fn = nullptr, *hc_ffn_base = nullptr, *hc_ffn_scale = nullptr;
  // attention
  DevMatrix wq_a, wq_b, wkv, wo_a, wo_b, comp_wkv, comp_wgate, idx_wq_b, idx_weights_proj, idx_wk;
  const float *q_norm = nullptr, *kv_norm = nullptr, *attn_sink = nullptr, *comp_norm = nullptr,
              *idx_k_norm = nullptr;
  const float* inv_freq = nullptr;
  // MoE: routed experts stacked [E, I, H] / [E, H, I]; all six matrices share one precision
  const float *gate = nullptr, *bias = nullptr;
  DevMatrix w1, w3, w2, shared_w1, shared_w3, shared_w2;
  // Engram
  const uint8_t *engram_table = nullptr, *engram_scale = nullptr;
  int64_t engram_rows = 0;
  const float *engram_wkv = nullptr, *engram_q = nullptr, *engram_k = nullptr;
};

struct CudaModelWeights {
  const float* embed = nullptr;          // [V, H] FP32, or
  const uint16_t* embed_bf16 = nullptr;  // [V, H] BF16 as stored
  DevMatrix head;
  const float* norm = nullptr;
  std::vector<CudaLayerWeights> layers;
  int64_t bytes = 0;  ///< device memory held
  std::vector<std::shared_ptr<void>> owned;
};

/// Uploads `w` (and per-layer RoPE inverse frequencies) to the current device.
CudaModelWeights upload_weights(const ModelPlan& plan, const ModelWeights& w,
                                const std::vector<std::vector<float>>& inv_freq);

}  // namespace dsv41rt::model
