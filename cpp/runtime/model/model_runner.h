// The DeepSeek-V4.1 forward, written once (architecture spec §2-§7): embed, then per block
// Engram -> mHC mix -> collapse -> attention by role -> expand -> mix -> collapse -> MoE -> expand
// (single-pass mHC), final collapse, norm, head and on-device sampling — as a fixed sequence of
// Backend ops driven by one host plan (forward_plan.h) uploaded per forward (forward_meta.h).
//
// Attention (model_runner_attention.cc): Q (low rank, RoPE) and the window KV (RoPE, FP8 QDQ) of
// every row; a Full layer compresses the new complete groups and appends index keys and
// compressed entries to the pages; index-source layers score the group's keys, build/apply the
// candidate blocks and publish the top-k that Reuse layers read; one softmax with sink over
// [window rows | selected entries] (the compressed rows through the per-ratio dequant
// workspace); inverse RoPE; grouped wo_a, wo_b. Window rows are read first and written last, so
// a chunk of any size works.
//
// DeepSeek-V4 (docs/design/v4.md) runs through the same sequence by role: q_b_norm after wq_b,
// CSA / HCA compressors (model_runner_v4.cc), the CSA indexer over its own keys, HCA attending
// every visible entry, hash-routed MoE layers, each sublayer's mHC collapse by its own pre and the
// hyper-head's final collapse.
//
// Streams: the main stream plus three side streams (window-KV store, compressor, indexer),
// forked once the layer's shared inputs are ready and joined before attention. Under context
// parallelism (begin() with a communicator) this rank computes the query rows g % size == rank
// and all-gathers each layer's normed hidden states, so every rank writes the whole batch's
// state (docs/design/context-parallel.md).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "dsv41rt/runtime.hpp"  // Decisions
#include "runtime/dequant_workspace.h"
#include "runtime/model/backend.h"
#include "runtime/model/forward_meta.h"
#include "runtime/model/forward_plan.h"
#include "runtime/model/group_collectives.h"
#include "runtime/model/state_layout.h"
#include "runtime/model/state_undo.h"

namespace dsv41rt::model {

/// Sums over layers of a context-parallel forward's Q projection, all-gather and the time both
/// ran (microseconds, rank 0's device time).
struct CpTiming {
  int64_t layers = 0, q_projection_us = 0, all_gather_us = 0, overlap_us = 0;
};

class ModelRunner {
 public:
  /// Everything is borrowed from the executor, which outlives the runner.
  ModelRunner(const ModelPlan& plan, Backend& backend, const BackendWeights& weights,
              const StateLayout& layout, KvPool& pool, DequantWorkspaces& workspaces);

  bool multistream = true;  ///< side streams (off: everything on the main stream)
  /// Sparse attention and the indexer scores read the quantised caches in place where the backend
  /// can (Backend::attention_reads_caches, indexer_reads_caches; off: unpack into FP32 first; the
  /// same bits either way).
  bool attention_in_place = true;
  /// Keep each forward's Decisions (top-k, experts, window-KV rounding inputs).
  bool record_decisions = false;
  /// Keep only the DSpark target features of Decisions (the drafter's input); set by the
  /// executor for an eager forward that serves a drafter.
  bool capture_dspark_features = false;
  /// Expert parallelism: the group over which this rank's routed-expert shard is combined (null
  /// or size 1: the weights hold every expert). Every rank runs every token (replicated attention).
  /// How the ranks' outputs combine is the backend's (Backend::expert_split): slots summed and
  /// combined in the one-rank order (bitwise), or partial sums added (one-rank up to FP32
  /// summation order).
  comm::Communicator* expert_comm = nullptr;
  /// Tensor parallelism: the group whose ranks hold a share of the heads, output groups and head
  /// vocabulary each (weights sliced so); outputs are all-gathered, never partially summed, so on
  /// a backend whose kernels' bits do not depend on the width of the matrix (the CPU), the result
  /// is bitwise the one-rank one. Null or size 1: the weights are whole.
  comm::Communicator* tensor_comm = nullptr;
  bool cp_timing = false;  ///< time the CP all-gather against the Q projection
  /// Rollback (state_undo.h): batch rows whose compressor rows (ratio >= 2 Full layers; V4: every
  /// compressor's projected rows and its APE) are also copied out as they are computed. Set by
  /// the executor for one eager forward.
  std::vector<CompressorCapture> capture_compressor;

  /// Host bookkeeping of a forward and the upload of its plan, outside any capture. With `comm`
  /// this runner is rank comm->rank() of a context-parallel group for this forward.
  void begin(const ForwardPlan& f, comm::Communicator* comm = nullptr);
  /// The forward's launch sequence on the main stream. Capture-safe after a begin() without
  /// a communicator while nothing is recorded.
  void run(const ForwardPlan& f);
  /// DeepSeek-V4's MTP layer s (spec 4.3, model_runner_mtp.cc) after run(f), on the final
  /// streams run() left (before the hyper-head): `next` [f.rows] is each row's next token
  /// x_{t+1}. Writes the layer's own window ring (slot ring plan.layers.size() + s) and leaves
  /// the logits of every query row [rows, V] at mtp_logits(). With record_decisions the streams
  /// fed in and the logits go to decisions() (mtp_streams / mtp_logits under stage s).
  void run_mtp(const ForwardPlan& f, const std::vector<int32_t>& next, int s = 0);
  const float* mtp_logits() const { return mtp_logits_.get(); }
  /// Resets the per-forward layer state run() consumes (a capture records run() without
  /// executing it; the eager run before it needs the same starting state).
  void reset_forward_state();

  /// Results of the last run, in backend memory: logits [head rows, V]; per sampled row the
  /// token and its raw logprob, and [sample rows, max_top] top alternatives.
  const float* logits() const { return logits_.get(); }
  const int32_t* tokens() const { return tokens_.get(); }
  const float* logprobs() const { return logprobs_.get(); }
  const int32_t* top_ids() const { return top_ids_.get(); }
  const float* top_logprobs() const { return top_lps_.get(); }
  Stream main() { return be_.stream(0); }

  /// Decisions of the last forward (see Executor::decisions).
  const Decisions& decisions() const { return decisions_; }
  /// Changes whenever a buffer a captured graph bakes in moves.
  uint64_t generation() const { return generation_; }
  const uint8_t* meta_base() const { return uploader_.base(); }
  /// The last CP forward's timing (after its synchronisation; cp_timing on).
  CpTiming read_cp_timing();

 private:
  enum Event : int { kFork, kQr, kKv, kStore, kComp, kIdx, kMixFork, kMixDone };
  template <typename T>
  T* buf(DeviceArray<T>& a, int64_t n) {
    return a.ensure(alloc_, std::max<int64_t>(n, 1), generation_);
  }
  Scratch scratch(DeviceArray<uint8_t>& a) { return Scratch(alloc_, a, generation_); }
  Stream side(int i) { return multistream ? be_.stream(1 + i) : main(); }
  /// Where a sublayer's mHC mix runs. V4.1's mix feeds only the next sublayer's collapse (pre) and
  /// this sublayer's expansion (post, comb), so it runs on its own stream beside the collapse, the
  /// norm and the sublayer, joined before the expansion (mix_joined). V4 collapses with the mix's
  /// own pre: the main stream.
  Stream mix_stream(bool v4) { return v4 ? main() : side(3); }
  void mix_forked(Stream m) { be_.link(kMixFork, main(), m); }
  void mix_joined(Stream m) { be_.link(kMixDone, m, main()); }

  void embed_and_layers(const ForwardPlan& f);
  void block(const LayerPlan& layer, const LayerWeights& w, const ForwardPlan& f, float* X,
             float* X1, const float* pre, float* f_pre);
  void ffn(const LayerPlan& layer, const LayerWeights& w, float* X1, float* X, const float* f_post,
           const float* f_comb, Stream mix);
  void head_and_sample(const ForwardPlan& f, const float* u);
  // model_runner_attention.cc
  void attention(const LayerPlan& layer, const LayerWeights& w, const ForwardPlan& f);
  void compressor(const LayerPlan& layer, const LayerWeights& w, const ForwardPlan& f,
                  const float* x, Stream s);
  void indexer(const LayerPlan& layer, const LayerWeights& w, const ForwardPlan& f, Stream s);
  // model_runner_v4.cc
  void v4_compressors(const LayerPlan& layer, const LayerWeights& w, const ForwardPlan& f,
                      const float* x, Stream s);
  void hca_select(const LayerPlan& layer, const ForwardPlan& f, Stream s);
  kernels::PagedRows paged(int source_layer, bool key, const ForwardPlan& f) const;
  // Context parallelism: local rows [nq, dim] -> plan rows [rows, dim] (one all-gather).
  void gather_rows(const float* local, int64_t dim, int64_t rows, float* out, Stream s);
  void cp_mark(int i, Stream s);
  // Appends rows x k decisions (each row sorted) to `into[layer]`.
  void record(std::map<int, std::vector<int32_t>>& into, std::map<int, int64_t>& width, int layer,
              const int32_t* values, int64_t rows, int64_t k);
  // Tensor parallelism: every rank's [rows, cols] block all-gathered into out [rows, P * cols]
  // (rank r's block at columns r * cols).
  void gather_columns(const float* local, int64_t rows, int64_t cols, float* out, Stream s);
  int64_t tp() const { return tensor_comm ? tensor_comm->size() : 1; }
  // Appends the rows x dim window-KV values entering their cache rounding to decisions_.
  void record_window_kv(int layer, const float* kv, int64_t rows, int64_t dim);
  bool dspark_target(int layer) const;
  void record_dspark_features(int layer, const float* X, int64_t rows, int64_t hc, int64_t H);

  const ModelPlan& plan_;
  Backend& be_;
  const BackendWeights& w_;
  const StateLayout& layout_;
  KvPool& pool_;
  DequantWorkspaces& workspaces_;
  Allocator alloc_;
  uint64_t generation_ = 0;
  MetaUploader uploader_;
  GroupCollectives collectives_;
  ForwardMeta meta_;

  // Per-forward layer state: the latest index source's top-k and the candidate source's ratio.
  int topk_source_ = -1;
  int candidates_ratio_ = -1;
  Decisions decisions_;

  // Activations (grown on demand).
  DeviceArray<float> X_, X1_, u_, xn_, yv_, pre_, a_pre_, a_post_, a_comb_, f_pre_, f_post_,
      f_comb_;
  DeviceArray<float> qr_, q_, kv_a_, o_, z_, cv_, cs_, latent_, qi_, wts_, ikeys_, scores_;
  DeviceArray<uint8_t> mask_;
  DeviceArray<int32_t> topk_, idx_, moe_idx_, moe_local_idx_;
  DeviceArray<float> moe_w_, moe_slots_, emb_, hsel_, logits_, tp_recv_, tp_local_;
  DeviceArray<uint8_t> engram_scratch_, moe_scratch_, sample_scratch_, mix_scratch_;
  DeviceArray<int32_t> tokens_, top_ids_;
  DeviceArray<float> logprobs_, top_lps_;
  // V4 MTP (run_mtp): its streams, the embedded next tokens, constants of the broadcast add.
  DeviceArray<float> mtp_X_, mtp_e_, mtp_ones_, mtp_eye_, mtp_logits_;
  DeviceArray<int32_t> mtp_next_;

  // Context parallelism, set for the duration of a forward begun with a communicator.
  comm::Communicator* comm_ = nullptr;
  QueryRows qv_;
  DeviceArray<float> cp_recv_, xg_, ug_;
  int64_t cp_layer_ = 0;
};

}  // namespace dsv41rt::model
