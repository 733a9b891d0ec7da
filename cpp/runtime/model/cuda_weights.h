// Device copies of the model weights for the CUDA executor: FP32 arrays uploaded from the
// loaded ModelWeights (the same values the CPU reference uses), routed experts stacked per layer
// ([E, I, H] / [E, H, I]) for the MoE kernels, Engram tables uploaded raw (FP8 + UE8M0 scales).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/model/weights.h"

namespace dsv41rt::model {

struct CudaLayerWeights {
  const float *attn_norm = nullptr, *ffn_norm = nullptr;
  const float *hc_attn_fn = nullptr, *hc_attn_base = nullptr, *hc_attn_scale = nullptr;
  const float *hc_ffn_fn = nullptr, *hc_ffn_base = nullptr, *hc_ffn_scale = nullptr;
  // attention
  const float *wq_a = nullptr, *q_norm = nullptr, *wq_b = nullptr, *wkv = nullptr,
              *kv_norm = nullptr, *wo_a = nullptr, *wo_b = nullptr, *attn_sink = nullptr;
  const float *comp_wkv = nullptr, *comp_wgate = nullptr, *comp_norm = nullptr;
  const float *idx_wq_b = nullptr, *idx_weights_proj = nullptr, *idx_wk = nullptr,
              *idx_k_norm = nullptr;
  const float* inv_freq = nullptr;
  // MoE
  const float *gate = nullptr, *bias = nullptr, *w1 = nullptr, *w3 = nullptr, *w2 = nullptr;
  const float *shared_w1 = nullptr, *shared_w3 = nullptr, *shared_w2 = nullptr;
  // Engram
  const uint8_t *engram_table = nullptr, *engram_scale = nullptr;
  int64_t engram_rows = 0;
  const float *engram_wkv = nullptr, *engram_q = nullptr, *engram_k = nullptr;
};

struct CudaModelWeights {
  const float* embed = nullptr;          // [V, H] FP32, or
  const uint16_t* embed_bf16 = nullptr;  // [V, H] BF16 as stored
  const float *head = nullptr, *norm = nullptr;
  std::vector<CudaLayerWeights> layers;
  int64_t bytes = 0;  ///< device memory held
  std::vector<std::shared_ptr<void>> owned;
};

/// Uploads `w` (and per-layer RoPE inverse frequencies) to the current device.
CudaModelWeights upload_weights(const ModelPlan& plan, const ModelWeights& w,
                                const std::vector<std::vector<float>>& inv_freq);

}  // namespace dsv41rt::model
