// The DSpark drafter forward (V4.1 spec §4.2), written once against the Backend ops: one parallel
// pass over a block of `dspark_block_size` draft rows, the reference being NeMo's
// DeepseekV41DSparkModel backbone (its build_position_ids / build_attention_mask):
//
//   main_x = main_norm(main_proj(features))     per target position, stage 0's tensors
//   X      = embed(ids) on every hc stream, pre-mix one-hot on stream 0
//   per stage s: mHC mix -> collapse -> attn_norm -> attention -> expand -> mix -> collapse ->
//                ffn_norm -> MoE (the draft's experts) -> expand   (single-pass mHC, as a block)
//   logits = head(norm(collapse(X))) + markov_head(previous)   confidence = proj([normed | markov])
//
// Attention of stage s: queries are the block rows (positions anchor .. anchor + block - 1); keys
// are the stage's ring, fp8_qdq(RoPE(kv_norm(wkv(main_x)))) of the target positions
// [anchor - window, anchor) (clipped at 0; the anchor's own feature is not read), followed by the
// block rows' own keys, every block row seeing every key (no causal mask), one softmax with the
// sink. The QDQ is the window cache's format (identity with cache quantisation off), as NeMo
// quantises both key sets with its window format.
#pragma once

#include <cstdint>
#include <vector>

#include "core/export.h"
#include "kernels/paged.h"
#include "runtime/model/backend.h"
#include "runtime/model/device_array.h"

namespace dsv41rt::model {

/// One block to draft (host memory).
struct DraftInputs {
  /// Target features [context, T * H] (T = dspark_target_layer_ids.size()): row i is target
  /// position first + i (Decisions::dspark_features of those layers, concatenated in their
  /// order).
  const float* features = nullptr;
  int64_t context = 0;  ///< rows of `features`
  int64_t width = 0;    ///< columns of `features` (must be T * H)
  int64_t first = 0;    ///< position of row 0 (a serving sequence keeps only its last rows)
  /// Position of the anchor token ids[0]: the block occupies positions anchor .. anchor + block
  /// - 1 and reads the features of [anchor - window, anchor) (clipped at 0), which must be rows
  /// of `features`: first <= max(0, anchor - window), anchor <= first + context.
  int64_t anchor = 0;
  std::vector<int32_t> ids;  ///< [block]: the anchor token, then noise tokens
  /// [block]: the Markov head's preceding token per row (run_greedy: only previous[0] is read,
  /// the anchor token in serving; the others become the drafted tokens).
  std::vector<int32_t> previous;
};

struct DraftOutputs {
  int64_t block = 0, vocab = 0;
  std::vector<float> logits;      ///< [block, vocab]: head + Markov head
  std::vector<float> confidence;  ///< [block]: confidence logits (uncalibrated)
  /// run_greedy: the drafted tokens, tokens[i] = argmax of logits row i (ties to the lowest id).
  std::vector<int32_t> tokens;
  /// With DraftRunner::record_window_kv: per stage, the keys entering their window-format QDQ
  /// [ring + block, head_dim] (ring rows, then block rows), as the executor's Decisions record
  /// the backbone's (an oracle aligns its near-tie roundings to them).
  std::vector<std::vector<float>> window_kv;
};

class DSV41RT_API DraftRunner {
 public:
  /// Borrowed: the plan and the backend's weights (loaded with their drafts) outlive the runner.
  /// `window`: the window cache's row format (the ring and block keys are QDQ'd in it).
  DraftRunner(const ModelPlan& plan, Backend& backend, const BackendWeights& weights,
              kernels::RowFormat window);

  /// Drafts one block; throws Error(kInvalidArgument) naming the bad input.
  DraftOutputs run(const DraftInputs& in);
  /// Drafts one block greedily, in order (spec 4.2): the backbone once, then per row i the
  /// Markov head of previous[i] (previous[0] from `in`, then the token drafted at row i - 1)
  /// and the row's argmax. The outputs are run()'s with previous = [in.previous[0], tokens[0],
  /// .., tokens[block - 2]], bitwise.
  DraftOutputs run_greedy(const DraftInputs& in);

  bool record_window_kv = false;  ///< fill DraftOutputs::window_kv

 private:
  template <typename T>
  T* buf(DeviceArray<T>& a, int64_t n) {
    return a.ensure(alloc_, std::max<int64_t>(n, 1), generation_);
  }
  Scratch scratch(DeviceArray<uint8_t>& a) { return Scratch(alloc_, a, generation_); }
  void check(const DraftInputs& in) const;
  // Uploads positions (ring then block), token ids, key indices and the one-hot pre-mix.
  void upload(const DraftInputs& in, int64_t ring_first, int64_t ring);
  void stage(const LayerPlan& layer, const LayerWeights& w, int64_t ring, DraftOutputs& out);
  void attention(const LayerWeights& w, int64_t ring, DraftOutputs& out);
  void backbone(const DraftInputs& in, DraftOutputs& out);
  // The heads: the shared head of the final state (logits_ without the Markov part), the Markov
  // head of rows [row0, row0 + n) added, then the confidence head and the copies out.
  void head_logits();
  void add_markov(int64_t row0, int64_t n);
  void finish(DraftOutputs& out);

  const ModelPlan& plan_;
  Backend& be_;
  const BackendWeights& w_;
  kernels::RowFormat window_;
  Allocator alloc_;
  uint64_t generation_ = 0;
  int64_t block_ = 0;

  DeviceArray<int64_t> positions_;
  DeviceArray<int32_t> ids_, previous_, key_idx_, moe_idx_;
  DeviceArray<float> features_, main_x_, X_, X1_, u_, xn_, y_, pre_, a_pre_, a_post_, a_comb_,
      f_pre_, f_post_, f_comb_;
  DeviceArray<float> qr_, q_, kv_, o_, z_, moe_w_, normed_, markov_, joined_, logits_, conf_;
  DeviceArray<uint8_t> mix_scratch_, moe_scratch_;
};

}  // namespace dsv41rt::model
