#include "runtime/model/model_executor.h"

#include <algorithm>

#include "core/status.h"
#include "kernels/rope.h"
#include "runtime/model/v4_support.h"

namespace dsv41rt::model {

namespace {

// Timing markers bracketing a forward (model_runner.cc numbers its own after these).
constexpr int kForwardStart = 0, kForwardEnd = 1;

// Expert parallelism by partial sums drops the shared expert on ranks > 0; a layer whose shared
// expert would change the MoE's numerics decision (moe_bf16_exact / moe_fp8_inputs) if left out
// cannot run so.
void check_expert_split(const Backend& be, const BackendWeights& w) {
  if (be.expert_split() != Backend::ExpertSplit::kPartialSums) return;
  for (size_t l = 0; l < w.layers.size(); ++l) {
    LayerWeights routed = w.layers[l];
    routed.shared_w1 = routed.shared_w3 = routed.shared_w2 = Matrix{};
    DSV41RT_CHECK_CODE(kUnsupported,
                       moe_fp8_inputs(routed) == moe_fp8_inputs(w.layers[l]) &&
                           moe_bf16_exact(routed) == moe_bf16_exact(w.layers[l]),
                       "expert parallelism on ", be.device(), ": layer ", l,
                       " stores its shared expert in another format than its routed experts");
  }
}

void check_engram_tables(const ModelConfig& c, const EngramTables& engram) {
  if (!c.engram) return;
  DSV41RT_CHECK(engram.layers.size() == c.engram->layer_ids.size(), c.source,
                ": Engram tables for ", engram.layers.size(), " layers, config has ",
                c.engram->layer_ids.size());
  DSV41RT_CHECK(int64_t(engram.token_map.size()) == c.vocab_size, c.source,
                ": Engram token map has ", engram.token_map.size(), " entries, vocab is ",
                c.vocab_size);
}

}  // namespace

// Per layer, the RoPE inverse frequencies (YaRN-scaled where the layer uses it; spec §2.3): the
// backbone layers, then the draft stages.
std::vector<std::vector<float>> rope_inv_freqs(const ModelPlan& plan) {
  const ModelConfig& c = plan.config;
  std::vector<std::vector<float>> out;
  for (const std::vector<LayerPlan>* layers : {&plan.layers, &plan.draft_layers}) {
    for (const LayerPlan& layer : *layers) {
      kernels::YarnParams yarn;
      const kernels::YarnParams* yp = nullptr;
      if (layer.yarn && c.yarn) {
        yarn.factor = c.yarn->factor;
        yarn.original_max_position = c.yarn->original_max_position;
        yarn.beta_fast = c.yarn->beta_fast;
        yarn.beta_slow = c.yarn->beta_slow;
        yp = &yarn;
      }
      out.push_back(kernels::cpu::rope_inv_freq(c.qk_rope_head_dim, layer.rope_base, yp));
    }
  }
  return out;
}

ModelExecutor::ModelExecutor(ModelPlan plan, ModelWeights weights, EngramTables engram,
                             ExecutorOptions options, std::unique_ptr<Backend> backend)
    : plan_(std::move(plan)),
      engram_(std::move(engram)),
      options_(std::move(options)),
      backend_(std::move(backend)),
      bf16_gemm_(options_.precision == "bf16" || options_.precision == "fp8"),
      fp8_act_(options_.precision == "fp8") {
  check_v4_options(plan_, options_);
  check_v4_backend(plan_, options_.device, backend_->has_v4_ops());
  backend_->activate();
  check_engram_tables(plan_.config, engram_);
  backend_->keep_engram_in_host_memory(options_.engram_host_memory);
  weights_ = backend_->load_weights(plan_, weights, rope_inv_freqs(plan_));
  layout_ = std::make_unique<StateLayout>(
      plan_, CacheFormats::of(plan_.config, options_.cache_quant), options_.page_tokens);
  memory_ = plan_memory(plan_, *layout_, options_.kv_memory, options_.max_num_seqs,
                        options_.max_num_batched_tokens, options_.max_model_len);
  const PoolGeometry g = layout_->geometry();
  Backend* be = backend_.get();
  pool_ = std::make_unique<KvPool>(KvPool::from_budget(
      g, memory_.num_slots * g.slot_bytes + memory_.num_pages * g.page_bytes, memory_.num_slots,
      [be](int64_t bytes) { return std::static_pointer_cast<uint8_t>(be->alloc(bytes)); }));
  histories_.assign(size_t(memory_.num_slots * std::max<int64_t>(layout_->history_len(), 1)), 0);
  host_copy_ = std::make_unique<BackendHostCopy>(
      *backend_, *pool_, std::max<int64_t>(layout_->history_len(), 1),
      [this](int32_t slot) { return history(pool_->slot_data(slot)); });
  workspaces_ = DequantWorkspaces([be](int64_t bytes) { return be->alloc(bytes); });
  runner_ =
      std::make_unique<ModelRunner>(plan_, *backend_, weights_, *layout_, *pool_, workspaces_);
  runner_->multistream = options_.multistream;
  runner_->record_decisions = options_.record_decisions;
  runner_->expert_comm = options_.ep_size > 1 ? options_.group_comm : nullptr;
  if (runner_->expert_comm) check_expert_split(*backend_, weights_);
  runner_->tensor_comm = options_.tp_size > 1 ? options_.group_comm : nullptr;
  mtp_ = !plan_.config.dspark && !weights_.drafts.empty();
  DSV41RT_CHECK_CODE(kUnsupported, !mtp_ || (!options_.group_comm && options_.device == "cpu"),
                     plan_.config.source,
                     ": V4's MTP layer runs on the cpu backend without parallelism only");
  if (plan_.config.dspark && !weights_.drafts.empty() && !options_.group_comm) {
    drafter_ = std::make_unique<DraftRunner>(plan_, *backend_, weights_, layout_->formats().window);
  }
}

ModelExecutor::~ModelExecutor() {
  try {
    backend_->activate();
    backend_->synchronize(backend_->stream(0));
  } catch (...) {  // destructors never throw
  }
}

int32_t* ModelExecutor::history(const uint8_t* slot) {
  const int64_t id = (slot - pool_->slot_data(0)) / pool_->geometry().slot_bytes;
  return histories_.data() + id * std::max<int64_t>(layout_->history_len(), 1);
}

void ModelExecutor::forward_impl(std::vector<BatchItem>& batch, comm::Communicator* comm) {
  backend_->activate();
  const ModelConfig& c = plan_.config;
  std::vector<const int32_t*> histories;
  for (const BatchItem& b : batch)
    histories.push_back(b.request.slot ? history(b.request.slot) : nullptr);
  const ForwardPlan f = plan_forward(plan_, *layout_, batch, engram_, histories);
  for (size_t l = 0; l < f.engram_rows.size(); ++l) {
    const int64_t limit = weights_.layers[c.engram->layer_ids[l]].engram_rows;
    for (int64_t r : f.engram_rows[l]) {
      DSV41RT_CHECK(r >= 0 && r < limit, "Engram row ", r, " outside the table (", limit, " rows)");
    }
  }
  // Decode batches run as the graph of their bucket where the backend has graphs; everything
  // else, and forwards that record decisions, eagerly.
  // Token masks (SampleSpec::mask) are per-step host data the graphs do not take: eager too.
  const bool masked = std::any_of(batch.begin(), batch.end(),
                                  [](const BatchItem& b) { return b.sample && b.sample->mask; });
  // Undoable items copy rows out as the forward runs: eager too.
  const bool undo =
      std::any_of(batch.begin(), batch.end(), [](const BatchItem& b) { return b.undo; });
  const bool features =
      std::any_of(batch.begin(), batch.end(), [](const BatchItem& b) { return b.dspark_features; });
  DSV41RT_CHECK_CODE(kInvalidArgument, !features || c.dspark,
                     "drafter features asked of a model without DSpark");
  // A tensor/expert-parallel rank captures its group's collectives into its graphs only over a
  // device communicator (NCCL: enqueued on the stream, capture safe); a host communicator
  // (LocalComm virtual ranks on one GPU) stages through host memory and synchronises: eager.
  const bool group_capturable = !options_.group_comm || options_.group_comm->device_buffers();
  const bool graphs = options_.cuda_graphs && backend_->supports_graphs() &&
                      !runner_->record_decisions && !comm && !masked && !undo && !features &&
                      !mtp_ && group_capturable;
  const DecodeBucket bucket = graphs ? decode_bucket(c, batch) : DecodeBucket{};
  // Precision "bf16" / "fp8" runs every forward with BF16 / FP8 GEMM inputs; the backend picks
  // its kernels by the forward's rows (decode-sized forwards on the skinny decode kernels).
  backend_->set_tensor_cores(bf16_gemm_);
  backend_->set_fp8_activations(fp8_act_);
  const bool decode_batch =
      std::all_of(batch.begin(), batch.end(), [](const BatchItem& b) { return b.n == 1; });
  backend_->set_forward_rows(f.rows, decode_batch);
  const Stream s = runner_->main();
  backend_->record_time(kForwardStart, s);
  if (bucket.items > 0) {
    const ForwardPlan padded = pad_decode_plan(f, c, *layout_, bucket);
    // Programmatic launch for small buckets only: on bench-40 (H200, fp8, ctx 4k, single runs)
    // it took 8.2% off a B 1 step and 4.8% off B 8, but added 0.7% at B 16, 1.8% at B 32 and 3.4%
    // at B 64, whose kernels are several waves long. A bucket's graph keeps the choice it was
    // captured with, so updates of it never change its edges.
    backend_->set_programmatic_launch(programmatic_launch_ &&
                                      bucket.items <= kProgrammaticLaunchMaxItems);
    runner_->begin(padded);
    graphs_.run(bucket, padded, *runner_, *backend_, workspaces_);
    // The replay holds the group's collectives: its watchdog watches the stream past them.
    if (options_.group_comm) options_.group_comm->watch_launch("decode graph", s.handle);
    copy_results(padded, batch);
  } else {
    runner_->begin(f, comm);
    std::shared_ptr<void> capture = undo ? begin_undo(f, batch) : nullptr;
    runner_->capture_dspark_features = features;
    try {
      runner_->run(f);
    } catch (...) {
      runner_->capture_compressor.clear();
      runner_->capture_dspark_features = false;
      throw;
    }
    runner_->capture_dspark_features = false;
    if (undo) finish_undo(batch);
    if (features) copy_dspark_features(f, batch, comm);
    ++eager_forwards_;
    copy_results(f, batch);
    if (mtp_) run_mtp(f, batch);
  }
  backend_->record_time(kForwardEnd, s);
  backend_->synchronize(s);
  // A collective that a group's watchdog aborted (a rank died or called differently) returned
  // early: this forward's results must not be used.
  if (comm) comm->check_healthy();
  if (options_.group_comm) options_.group_comm->check_healthy();
  last_forward_us_ = int64_t(backend_->elapsed_ms(kForwardStart, kForwardEnd) * 1000.0);
  if (comm && runner_->cp_timing) cp_timing_ = runner_->read_cp_timing();
  // Engram history: the last `hist` ids of (old history, chunk).
  const int64_t hist = layout_->history_len();
  for (BatchItem& b : batch) {
    if (hist == 0) break;
    int32_t* h = history(b.request.slot);
    std::vector<int32_t> all(h, h + hist);
    all.insert(all.end(), b.tokens, b.tokens + b.n);
    std::copy(all.end() - hist, all.end(), h);
  }
}

// Copies out what leaves the device: the logits of the items that want them (straight into their
// buffers), and each sampled token with its logprob (and top alternatives when asked) into the
// items' SampledTokens.
void ModelExecutor::copy_results(const ForwardPlan& f, std::vector<BatchItem>& batch) {
  const int64_t V = plan_.config.vocab_size;
  const Stream s = runner_->main();
  for (size_t i = 0; i < batch.size(); ++i) {
    const BatchItem& b = batch[i];
    if (!b.logits) continue;
    const int64_t rows = b.all_logits ? b.n : 1;
    backend_->to_host(b.logits, runner_->logits() + f.head_first[i] * V,
                      rows * V * int64_t(sizeof(float)), s);
  }
  const SamplePlan& sp = f.sample;
  const int64_t n = sp.rows();
  if (n <= 0) return;
  bool top = false;
  for (int64_t r = 0; r < n; ++r) top = top || (sp.item[r] >= 0 && sp.params[r].top_logprobs > 0);
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  std::vector<float> logprobs(static_cast<size_t>(n));
  const size_t top_count = top ? size_t(n) * size_t(std::max<int32_t>(sp.max_top, 0)) : 0;
  std::vector<int32_t> top_ids(top_count);
  std::vector<float> top_lps(top_ids.size());
  backend_->to_host(tokens.data(), runner_->tokens(), n * 4, s);
  backend_->to_host(logprobs.data(), runner_->logprobs(), n * 4, s);
  if (top) {
    backend_->to_host(top_ids.data(), runner_->top_ids(), n * sp.max_top * 4, s);
    backend_->to_host(top_lps.data(), runner_->top_logprobs(), n * sp.max_top * 4, s);
  }
  backend_->synchronize(s);
  for (int64_t r = 0; r < n; ++r) {
    if (sp.item[r] < 0) continue;
    kernels::SampledToken& out = *batch[size_t(sp.item[r])].sampled;
    DSV41RT_CHECK(tokens[r] >= 0 && tokens[r] < V,
                  "sampling produced no valid token (non-finite "
                  "logits?) for batch item ",
                  sp.item[r]);
    out.token = tokens[r];
    out.logprob = logprobs[r];
    const int32_t k = std::min(sp.params[r].top_logprobs, sp.max_top);
    out.top_ids.assign(top_ids.begin() + r * sp.max_top, top_ids.begin() + r * sp.max_top + k);
    out.top_logprobs.assign(top_lps.begin() + r * sp.max_top, top_lps.begin() + r * sp.max_top + k);
  }
}

void ModelExecutor::copy_state(const RequestView& src, const RequestView& dst) {
  check_copy_state(*pool_, src, dst);
  backend_->activate();
  const PoolGeometry& g = pool_->geometry();
  const Stream s = backend_->stream(0);
  backend_->copy(dst.slot, src.slot, g.slot_bytes, s);
  for (int64_t i = 0; i < pool_->pages_for(src.length); ++i) {
    backend_->copy(pool_->page_data(dst.pages[i]), pool_->page_data(src.pages[i]), g.page_bytes, s);
  }
  backend_->synchronize(s);
  const int64_t hist = std::max<int64_t>(layout_->history_len(), 1);
  const int32_t* from = history(src.slot);
  std::copy(from, from + hist, history(dst.slot));
}

void ModelExecutor::set_switch(Switch which, bool on) {
  const bool gpu = backend_->supports_graphs();
  switch (which) {
    case Switch::kMultistream:
    case Switch::kCudaGraphs:
      DSV41RT_CHECK_CODE(kUnsupported, gpu, "the ",
                         which == Switch::kMultistream ? "multistream" : "cuda_graphs",
                         " switch does not apply to the ", device(), " executor");
      if (which == Switch::kMultistream) {
        runner_->multistream = on;
        graphs_.clear();  // captured graphs bake in the stream layout
      } else {
        options_.cuda_graphs = on;
      }
      return;
    case Switch::kTensorCores:
      bf16_gemm_ = on;
      graphs_.clear();  // captured graphs bake in the kernels
      return;
    case Switch::kCpTiming:
      runner_->cp_timing = on;
      return;
    case Switch::kAttentionInPlace:
      runner_->attention_in_place = on;
      graphs_.clear();  // captured graphs bake in the unpacks or their absence
      return;
    case Switch::kProgrammaticLaunch:
      DSV41RT_CHECK_CODE(kUnsupported, gpu, "the programmatic_launch switch does not apply to the ",
                         device(), " executor");
      programmatic_launch_ = on;
      graphs_.clear();  // captured graphs bake in their edges
      return;
  }
}

BackendStats ModelExecutor::backend_stats() const {
  const std::map<std::string, int64_t> b = backend_->stats();
  auto get = [&b](const char* key) {
    auto it = b.find(key);
    return it == b.end() ? int64_t(0) : it->second;
  };
  BackendStats s;
  s.weight_bytes = weights_.bytes;
  s.weight_host_bytes = weights_.host_bytes;
  s.weight_host_in_place_bytes = weights_.host_in_place_bytes;
  s.d2h_bytes = get("d2h_bytes");
  s.graph_updates = get("graph_updates");
  s.programmatic_edges = get("programmatic_edges");
  s.eager_forwards = eager_forwards_ + graphs_.eager();
  s.graph_captures = graphs_.captures();
  s.graph_replays = graphs_.replays();
  s.graphs = graphs_.size();
  s.last_forward_us = last_forward_us_;
  s.multistream = runner_->multistream;
  s.cuda_graphs = options_.cuda_graphs && backend_->supports_graphs();
  s.tensor_cores = bf16_gemm_;
  s.cp_layers_timed = cp_timing_.layers;
  s.cp_q_projection_us = cp_timing_.q_projection_us;
  s.cp_all_gather_us = cp_timing_.all_gather_us;
  s.cp_overlap_us = cp_timing_.overlap_us;
  return s;
}

}  // namespace dsv41rt::model
