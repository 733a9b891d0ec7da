// FP32 weights of the CPU reference backend, dequantised once at load from the release formats
// (FP8 E4M3 + UE8M0 block scales, packed FP4 + 1x32 scales, BF16/F16/F32), named as released.
// Engram tables stay in the memory-mapped checkpoint (they are huge at release size) and rows are
// dequantised on gather.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/export.h"
#include "core/safetensors.h"
#include "runtime/model/layer_plan.h"

namespace dsv41rt::model {

struct SyntheticTensor;  // synthetic_weights.h
struct SyntheticManifest;

/// How a tensor is stored in the mapped checkpoint (validated at load): FP8 E4M3 with UE8M0
/// block scales [ceil(rows/block_rows), ceil(cols/block_cols)], packed FP4 (I8) with UE8M0
/// scales [rows, cols/32], or plain F32/BF16/F16. Pointers stay valid while the checkpoint lives.
/// A synthetic tensor loaded lazily has no bytes (data and scale null): `synthetic` describes it
/// and the source is its rows [synthetic_row, synthetic_row + rows), generated where a backend
/// takes them (materialize_host_values; the CUDA upload).
struct TensorSource {
  DType dtype = DType::kF32;
  const uint8_t* data = nullptr;
  const uint8_t* scale = nullptr;
  int64_t rows = 0, cols = 0, block_rows = 0, block_cols = 0;
  std::shared_ptr<const SyntheticTensor> synthetic;
  int64_t synthetic_row = 0;
  bool lazy() const { return synthetic != nullptr; }
};

struct Tensor {
  std::vector<int64_t> shape;
  std::vector<float> data;  ///< FP32 values; empty when loaded without host values
  TensorSource source;
  /// Rows of the tensor this is a tensor-parallel share of (tensor_shard); 0: not a share.
  int64_t whole_rows = 0;
  const float* ptr() const { return data.empty() ? nullptr : data.data(); }
  bool empty() const { return data.empty() && source.data == nullptr && !source.lazy(); }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

/// Stored in a format BF16 holds exactly (FP8 E4M3 or packed FP4 with power-of-two scales, BF16):
/// the GPU keeps such matrices in BF16 and multiplies them on tensor cores under precision
/// "bf16"; others stay FP32 there. The CPU emulation of that mode follows the same rule.
DSV41RT_API bool bf16_exact(const Tensor& t);
/// Stored FP8 E4M3 or packed FP4: precision "fp8" quantises the input of its GEMM (spec 5.2).
DSV41RT_API bool fp8_input(const Tensor& t);

/// FP32 values of `t` (its data, or decoded from its source on the host; a lazy synthetic source
/// generates its rows for this).
DSV41RT_API std::vector<float> host_values(const Tensor& t);

/// The stored codes of a lazy synthetic source's rows, generated on the host (CPU reference).
DSV41RT_API std::vector<uint8_t> synthetic_codes(const TensorSource& s);

struct AttentionWeights {
  Tensor wq_a, q_norm, wq_b, wkv, kv_norm, wo_a, wo_b, attn_sink;
  Tensor comp_wkv, comp_wgate, comp_norm;  // Full (V4.1): compressor
  Tensor idx_wq_b, idx_weights_proj;       // Full + Reindex: indexer queries
  Tensor idx_wk, idx_k_norm;               // Full: index keys
  // V4 CSA / HCA: the compressor's APE [ratio, width] (wkv, wgate, norm above); CSA: its indexer's
  // own compressor (kernels/v4_compressor.h; wkv / wgate [2 index_head_dim, H]).
  Tensor comp_ape, idx_comp_wkv, idx_comp_wgate, idx_comp_ape, idx_comp_norm;
};

struct MoeWeights {
  Tensor gate, bias;
  std::vector<int32_t> tid2eid;    // V4 hash layers [vocab, k]
  std::vector<Tensor> w1, w2, w3;  // experts [expert_begin, expert_begin + w1.size())
  int64_t expert_begin = 0;
  Tensor shared_w1, shared_w2, shared_w3;
};

struct EngramWeights {
  const uint8_t* table = nullptr;        // FP8 E4M3 [rows, head_dim] in the mapped checkpoint
  const uint8_t* table_scale = nullptr;  // UE8M0 [rows, head_dim / 32]
  int64_t rows = 0;
  /// A synthetic table loaded lazily (table and table_scale null until generated: the backend
  /// generates it whole where it keeps it, or materialize_host_values into `generated`).
  std::shared_ptr<const SyntheticTensor> synthetic;
  std::shared_ptr<const std::vector<uint8_t>> generated;  // codes, then scales
  Tensor wkv, q_weight, k_weight;
};

struct BlockWeights {
  Tensor attn_norm, ffn_norm;
  Tensor hc_attn_fn, hc_attn_base, hc_attn_scale, hc_ffn_fn, hc_ffn_base, hc_ffn_scale;
  AttentionWeights attn;
  MoeWeights moe;
  std::optional<EngramWeights> engram;
};

/// The DSpark drafter (V4.1, spec 4.2): the stages `mtp.s` (blocks like the backbone's) and the
/// tensors beside them: main_proj / main_norm on stage 0, norm and the Markov and confidence heads
/// on the last. The embedding and the head are the backbone's.
/// V4's MTP (spec 4.3) is one stage `mtp.0` with e_proj / h_proj [H, H], enorm / hnorm / norm [H]
/// and its own hyper-head (hc_head_*); the DSpark-only tensors stay empty there and vice versa.
struct DraftWeights {
  std::vector<BlockWeights> stages;
  Tensor main_proj, main_norm;                         // [H, T * H], [H]
  Tensor norm, markov_embed, markov_head, confidence;  // [H], [V, r], [V, r], [1, H + r]
  Tensor e_proj, h_proj, enorm, hnorm;                 // V4 MTP
  Tensor hc_head_fn, hc_head_base, hc_head_scale;      // V4 MTP: [n, n * H], [n], [1]
};

struct ModelWeights {
  std::shared_ptr<Checkpoint> checkpoint;  // keeps the mapped files (embed, Engram tables) alive
  const uint16_t* embed_bf16 = nullptr;    // [vocab, hidden] when stored BF16 (decoded on gather)
  Tensor embed;                            // otherwise dequantised here
  Tensor head, norm;
  Tensor hc_head_fn, hc_head_base, hc_head_scale;  // V4: the final mHC collapse (hyper-head)
  std::vector<BlockWeights> layers;
  /// Loaded only when asked (load_weights' `drafts`): plain serving keeps their memory.
  std::optional<DraftWeights> drafts;
};

/// Loads every backbone tensor the plan needs, with names, shapes and stored forms from the
/// tensor spec (tensor_spec.h); throws Error naming the tensor on any mismatch with it (as
/// checkpoint validation would report it). host_values = false checks every tensor it reads but
/// keeps only the sources (the GPU executor dequantises on the device; a released checkpoint
/// would not fit in host memory as FP32).
/// `progress(done, total)` (optional) is called after each block's tensors are loaded.
/// `drafts`: also the DSpark drafter's tensors or V4's MTP layer (ModelWeights::drafts); throws
/// Error(kUnsupported) when the config has no draft stages.
/// `synthetic`: the manifest of a checkpoint opened lazily (open_checkpoint with
/// SyntheticLoad::kLazy): its tensors are checked against the spec by their descriptors and kept
/// lazy (TensorSource::synthetic, no host values even with host_values) until a backend takes
/// them.
DSV41RT_API ModelWeights
load_weights(std::shared_ptr<Checkpoint> checkpoint, const ModelPlan& plan, bool host_values = true,
             const std::function<void(int64_t done, int64_t total)>& progress = {},
             bool drafts = false, std::shared_ptr<const SyntheticManifest> synthetic = nullptr);

/// Generates what `w` holds of lazy synthetic tensors on the host: each lazy tensor's rows as FP32
/// host values (its source stays lazy, for bf16_exact / fp8_input), each lazy Engram table whole
/// into EngramWeights::generated. Called by the CPU backend on a rank's shard, so a rank generates
/// its share only. Returns the code bytes generated.
DSV41RT_API int64_t materialize_host_values(ModelWeights& w);

/// Expert parallelism: the weights rank `rank` of `size` holds, every layer's routed experts cut
/// to its contiguous share [rank * E / size, (rank + 1) * E / size) (the rest freed; the
/// replicated parts are shared with `all`). Throws Error(kInvalidArgument) naming the layer when
/// size does not divide its expert count.
DSV41RT_API ModelWeights expert_shard(const ModelWeights& all, const ModelPlan& plan, int rank,
                                      int size);

/// Tensor parallelism: the weights rank `rank` of `size` holds: its heads' rows of every layer's
/// wq_b and attn_sink, its output groups' rows of wo_a (when size divides o_groups; else wo_a
/// whole), and its rows of the vocabulary head (contiguous shares); the rest whole. The shares keep
/// their host values when `all` has them, and view their stored bytes either way (what a device
/// backend uploads; FP8 shares must fall on whole scale blocks). Throws Error(kInvalidArgument)
/// naming the dimension `size` does not divide. `all` is taken by value: pass a rank's expert shard
/// with std::move and nothing is copied but the rows it keeps. The drafts are dropped (the drafter
/// runs unsharded), as expert_shard leaves them out.
DSV41RT_API ModelWeights tensor_shard(ModelWeights all, const ModelPlan& plan, int rank, int size);

}  // namespace dsv41rt::model
