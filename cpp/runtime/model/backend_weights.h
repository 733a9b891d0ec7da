// The model's weights as a backend stores them (host memory on the CPU, device memory on CUDA):
// raw pointers the model runner hands to the backend's ops, plus the storage that keeps them
// alive. Built once at load by Backend::load_weights from the validated ModelWeights.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/status.h"
#include "kernels/weight_view.h"

namespace dsv41rt::model {

/// Storage of a weight matrix (kernels/weight_view.h): FP32, BF16, or the checkpoint's released
/// FP8-block / MXFP4 codes with their UE8M0 scales, kept as stored (no expansion at load).
using WeightFormat = kernels::WeightFormat;

/// A weight matrix (or a stack of them, e.g. [E, I, H] experts, one 2-D view of E * I rows) on
/// the backend.
struct Matrix {
  const void* data = nullptr;
  WeightFormat format = WeightFormat::kF32;
  /// The values are exactly representable in BF16 (the checkpoint stores them FP8 / FP4 / BF16):
  /// precision "bf16" puts such matrices on tensor cores (the CPU emulates it by rounding the
  /// activations); the others stay FP32.
  bool bf16_exact = false;
  /// The checkpoint stores it FP8 / FP4 (an "FP8 or FP4 GEMM" of spec section 5.2): precision
  /// "fp8" quantises its input activations to FP8 in 1 x 32 blocks (implies bf16_exact).
  bool fp8_input = false;
  const uint8_t* scale = nullptr;          ///< kFp8Block / kMxfp4 scale codes
  int32_t block_rows = 0, block_cols = 0;  ///< kFp8Block scale blocks
  /// Rows and columns of the whole stored 2-D matrix; required for kFp8Block / kMxfp4 (0 for
  /// kF32 / kBF16 means "as the op's shape").
  int64_t rows = 0, cols = 0;
  /// Rows of the matrix this is a tensor-parallel share of (0: whole): kernels whose summation
  /// order depends on the matrix's width (split-K counts) choose it for these, so a share's
  /// outputs are bitwise the whole matrix's columns.
  int64_t whole_rows = 0;
  explicit operator bool() const { return data != nullptr; }

  /// This matrix as an op of shape [rows, cols] reads it; throws Error(kInternal) when the
  /// stored shape differs (a loader bug, never a user input) or a released format lacks scales.
  kernels::WeightView view(int64_t op_rows, int64_t op_cols) const {
    const bool released = format == WeightFormat::kFp8Block || format == WeightFormat::kMxfp4;
    DSV41RT_CHECK_CODE(kInternal,
                       (rows == 0 && cols == 0 && !released) ||
                           (rows == op_rows && cols == op_cols && (!released || scale)),
                       "weight matrix stored as [", rows, ", ", cols, "] read as [", op_rows, ", ",
                       op_cols, "]");
    return {data, scale, format, block_rows, block_cols, op_rows, op_cols};
  }
};

struct LayerWeights {
  const float *attn_norm = nullptr, *ffn_norm = nullptr;
  const float *hc_attn_fn = nullptr, *hc_attn_base = nullptr, *hc_attn_scale = nullptr;
  const float *hc_ffn_fn = nullptr, *hc_ffn_base = nullptr, *hc_ffn_scale = nullptr;
  // attention
  Matrix wq_a, wq_b, wkv, wo_a, wo_b, comp_wkv, comp_wgate, idx_wq_b, idx_weights_proj, idx_wk;
  const float *q_norm = nullptr, *kv_norm = nullptr, *attn_sink = nullptr, *comp_norm = nullptr,
              *idx_k_norm = nullptr;
  const float* inv_freq = nullptr;  ///< RoPE inverse frequencies of this layer
  // V4 CSA / HCA: the compressor's APE [ratio, width] (comp_wkv / comp_wgate / comp_norm above);
  // CSA: its indexer's own compressor (kernels/v4_compressor.h).
  const float* comp_ape = nullptr;
  Matrix idx_comp_wkv, idx_comp_wgate;
  const float *idx_comp_ape = nullptr, *idx_comp_norm = nullptr;
  // MoE: routed experts stacked [E, I, H] / [E, H, I]; all six matrices share one format. Under
  // expert parallelism the stacks hold this rank's experts [expert_begin, + expert_count) only
  // (expert_count 0: all E).
  const float *gate = nullptr, *bias = nullptr;
  const int32_t* tid2eid = nullptr;  ///< V4 hash-routed layers: [vocab, k] expert ids
  Matrix w1, w3, w2, shared_w1, shared_w3, shared_w2;
  int64_t expert_begin = 0, expert_count = 0;
  // Engram: FP8 E4M3 table [rows, head_dim] with UE8M0 scales [rows, head_dim / 32]; the kv
  // projection [(n + 1) H, D] as the checkpoint stores it (FP8 32 x 32 on release).
  const uint8_t *engram_table = nullptr, *engram_scale = nullptr;
  int64_t engram_rows = 0;
  Matrix engram_wkv;
  const float *engram_q = nullptr, *engram_k = nullptr;
};

/// Whether every expert matrix of a layer (routed and shared) is BF16-exact: the MoE op runs on
/// tensor cores under precision "bf16" only then (one decision for the whole op, on every
/// backend, so the CPU emulation rounds the same activations the GPU does).
inline bool moe_bf16_exact(const LayerWeights& w) {
  const bool shared =
      !w.shared_w1 || (w.shared_w1.bf16_exact && w.shared_w3.bf16_exact && w.shared_w2.bf16_exact);
  return w.w1.bf16_exact && w.w3.bf16_exact && w.w2.bf16_exact && shared;
}

/// Whether every expert matrix of a layer is stored FP8 / FP4: precision "fp8" then quantises the
/// MoE's activations (x and the hidden units) to FP8 (one decision for the whole op).
inline bool moe_fp8_inputs(const LayerWeights& w) {
  const bool shared =
      !w.shared_w1 || (w.shared_w1.fp8_input && w.shared_w3.fp8_input && w.shared_w2.fp8_input);
  return w.w1.fp8_input && w.w3.fp8_input && w.w2.fp8_input && shared;
}

/// The DSpark drafter's tensors beside its stages (ModelWeights::drafts): main_proj [H, T * H] and
/// main_norm on stage 0; the final norm, the Markov head (embed [V, r] read by row, head [V, r])
/// and the confidence head [1, H + r] on the last stage.
/// V4's MTP (spec 4.3): e_proj / h_proj [H, H], enorm / hnorm and its own hyper-head (norm is
/// `norm` above); the DSpark fields stay empty there.
struct DraftHeadWeights {
  Matrix main_proj;
  const float *main_norm = nullptr, *norm = nullptr, *markov_embed = nullptr;
  Matrix markov_head, confidence;
  Matrix e_proj, h_proj;
  const float *enorm = nullptr, *hnorm = nullptr;
  const float *hc_head_fn = nullptr, *hc_head_base = nullptr, *hc_head_scale = nullptr;
};

struct BackendWeights {
  const float* embed = nullptr;          ///< [V, H] FP32, or
  const uint16_t* embed_bf16 = nullptr;  ///< [V, H] BF16 as stored
  Matrix head;
  const float* norm = nullptr;
  /// V4: the hyper-head (kernels/mhc.h hc_head_pre): fn [n, n·H], base [n], scale [1].
  const float *hc_head_fn = nullptr, *hc_head_base = nullptr, *hc_head_scale = nullptr;
  std::vector<LayerWeights> layers;
  /// DSpark stages (empty unless the weights were loaded with their drafts; a backend that does
  /// not map them leaves this empty) and their heads.
  std::vector<LayerWeights> drafts;
  DraftHeadWeights draft_heads;
  int64_t bytes = 0;       ///< backend memory held by the weights
  int64_t host_bytes = 0;  ///< pinned host memory the device reads (Engram tables, on request)
  /// Of host_bytes, the checkpoint's own pages read in place (registered once per process,
  /// host_registration.h) rather than a pinned copy.
  int64_t host_in_place_bytes = 0;
  std::vector<std::shared_ptr<void>> owned;  ///< keeps the storage alive
};

}  // namespace dsv41rt::model
