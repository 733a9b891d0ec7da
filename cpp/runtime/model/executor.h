// The eager CPU reference executor of DeepSeek-V4.1 (architecture spec §2-§7): runs the layer
// plan over one request's tokens, reading and updating that request's state. FP32 throughout;
// cache values pass through the release's quantisers exactly as the reference does.
//
// A forward processes the next `n` tokens of a request (a whole prompt, a prefill chunk of any
// size, or one decode token); prefill + decode equals one forward over the same tokens.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/dequant_workspace.h"
#include "runtime/export.h"
#include "runtime/model/layer_plan.h"
#include "runtime/model/request_state.h"
#include "runtime/model/weights.h"

namespace dsv41rt::model {

/// Engram hashing inputs the control plane derives from the tokenizer (spec §4.1): the
/// normalised-token map and, per Engram layer in config order, the hash multipliers and the
/// bucket primes/offsets.
struct EngramTables {
  std::vector<int32_t> token_map;  // [vocab] compressed id of every token id
  struct Layer {
    std::vector<int64_t> multipliers;      // [max_ngram]
    std::vector<int64_t> primes, offsets;  // [(max_ngram - 1) * n_heads]
  };
  std::vector<Layer> layers;
};

struct ExecutorOptions {
  /// Debug switch for parity checks: false keeps every cache (window KV, compressed KV, index keys)
  /// and the indexer queries in FP32 instead of passing them through the release's quantisers —
  /// the reference's "cache quantisation off" mode, which is smooth at FP32 level.
  bool cache_quant = true;
  /// Record each forward's discrete decisions (indexer top-k and routed experts per layer) so a
  /// parity test can tell a decision flip from a bug.
  bool record_decisions = false;
};

/// How one cache kind is stored: packed release format, or raw FP32 with cache_quant off.
struct RowCodec {
  int64_t dim = 0;
  int64_t row_bytes = 0;
  void (*pack)(const float*, int64_t, int64_t, uint8_t*) = nullptr;
  void (*unpack)(const uint8_t*, int64_t, int64_t, float*) = nullptr;
  void (*qdq)(const float*, int64_t, int64_t, float*) = nullptr;  // nullptr: identity
};

class DSV41RT_API CpuExecutor {
 public:
  CpuExecutor(ModelPlan plan, ModelWeights weights, EngramTables engram,
              ExecutorOptions options = {});

  RequestState new_request() const;
  /// Runs tokens[0..n) at positions state.length.. and appends them to the state. Writes logits
  /// [n, vocab] (all_logits) or [1, vocab] (the last position only).
  void forward(RequestState& state, const int32_t* tokens, int64_t n, float* logits,
               bool all_logits = true);

  const ModelPlan& plan() const { return plan_; }
  /// Decisions of the last forward (record_decisions): "topk_L<l>" [n, index_topk] (sorted, -1 =
  /// none) for index-source layers and "experts_L<l>" [n, k] (sorted) for every layer.
  const std::map<std::string, std::vector<int32_t>>& decisions() const { return decisions_; }
  DequantWorkspaces& workspaces() { return workspaces_; }

 private:
  struct Shared;  // per-forward state shared between layers (published top-k, candidates)
  void embed(const int32_t* tokens, int64_t n, float* X) const;
  void engram(int layer_pos, const BlockWeights& w, const std::vector<int64_t>& cids, int64_t n,
              float* X) const;
  void attention(const LayerPlan& layer, const AttentionWeights& w, RequestState& state,
                 Shared& shared, const float* x, int64_t n, float* y);
  void compress(const LayerPlan& layer, const AttentionWeights& w, SourceState& src, const float* x,
                int64_t n);
  void moe(const LayerPlan& layer, const MoeWeights& w, const float* x, int64_t n, float* y);

  ModelPlan plan_;
  ModelWeights weights_;
  EngramTables engram_;
  std::vector<std::vector<float>> inv_freq_;  // per layer
  DequantWorkspaces workspaces_;
  ExecutorOptions options_;
  RowCodec window_codec_, kv_codec_, key_codec_;
  std::map<std::string, std::vector<int32_t>> decisions_;
};

}  // namespace dsv41rt::model
