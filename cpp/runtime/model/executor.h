// The eager CPU reference executor of DeepSeek-V4.1 (architecture spec §2-§7): runs the layer
// plan over one request's tokens, reading and updating that request's state. FP32 throughout;
// cache values pass through the release's quantisers exactly as the reference does.
//
// A forward processes the next `n` tokens of a request (a whole prompt, a prefill chunk of any
// size, or one decode token); prefill + decode equals one forward over the same tokens.
#pragma once

#include <cstdint>
#include <memory>
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

class DSV41RT_API CpuExecutor {
 public:
  CpuExecutor(ModelPlan plan, ModelWeights weights, EngramTables engram);

  RequestState new_request() const;
  /// Runs tokens[0..n) at positions state.length.. and appends them to the state. Writes logits
  /// [n, vocab] (all_logits) or [1, vocab] (the last position only).
  void forward(RequestState& state, const int32_t* tokens, int64_t n, float* logits,
               bool all_logits = true);

  const ModelPlan& plan() const { return plan_; }
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
  void moe(const LayerPlan& layer, const MoeWeights& w, const float* x, int64_t n, float* y) const;

  ModelPlan plan_;
  ModelWeights weights_;
  EngramTables engram_;
  std::vector<std::vector<float>> inv_freq_;  // per layer
  DequantWorkspaces workspaces_;
};

}  // namespace dsv41rt::model
