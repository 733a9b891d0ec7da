// The eager CPU reference executor of DeepSeek-V4.1 (architecture spec §2-§7). FP32 throughout;
// cache values pass through the release's quantisers exactly as the reference does.
//
// A forward runs a batch of items; an item is the next `n` tokens of one request (a whole prompt,
// a prefill chunk of any size, or one decode token) at positions length.., reading and updating
// that request's paged state (slot + token pages of the executor's KvPool). Every op computes a
// row with a fixed reduction order independent of the other rows, so a request's logits do not
// depend on how its prompt was chunked or on what else is in the batch.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "runtime/dequant_workspace.h"
#include "runtime/model/kv_pool.h"
#include "core/export.h"
#include "runtime/model/layer_plan.h"
#include "runtime/model/state_layout.h"
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
  /// KV pool: bytes for slots + token pages, the most requests held at once, positions per page
  /// (a multiple of every compression ratio).
  int64_t kv_memory_bytes = 256ll << 20;
  int64_t max_requests = 64;
  int64_t page_tokens = 64;
  /// Tokens per forward the engine will schedule (sizes the activation scratch in the budget).
  int64_t token_budget = 512;
  /// The longest request (prompt + generated) the engine admits; 0 = the whole pool. Sizes the
  /// indexer's score scratch (token_budget queries x the entries of one request): charged once
  /// when set, per page of the pool when not (a request may then hold every page).
  int64_t max_context = 0;
  /// "cpu" (the FP32 reference executor) or "cuda" / "cuda:N" (the GPU executor).
  std::string device = "cpu";
  /// CUDA only: run the window-KV store, the compressor and the indexer on side streams (off:
  /// everything on the main stream, same results).
  bool multistream = true;
  /// CUDA only: replay captured CUDA graphs for decode batches (off: always eager).
  bool cuda_graphs = true;
  /// GEMM precision. "fp32": every projection and expert in FP32 (the reference's numerics; the
  /// weights are exact BF16 on the device). "bf16": in forwards of more than 8 rows, projections
  /// and experts take BF16-rounded inputs with FP32 accumulation - on CUDA the tensor-core serving
  /// mode, on the CPU its emulation (the reference the GPU path is tested against). Results then
  /// depend on the batch at BF16 rounding level.
  std::string precision = "fp32";
  /// Context parallelism (docs/design/context-parallel.md): prefill forwards are split
  /// round-robin over this many ranks (virtual ranks over LocalComm in one process); 1 = off.
  int64_t cp_size = 1;
  /// The CP communicator: "local" (LocalComm: every rank on options.device, state staged through
  /// host memory on CUDA) or "nccl" (NcclComm: rank r on CUDA device base + r, all driven from
  /// this process; cp_size 1 runs the CP data flow over a one-rank NCCL group).
  std::string cp_comm = "local";
  /// One process per rank: this process is rank cp_rank of the cp_size group over cp_comm "nccl"
  /// (cp_id: the 128 bytes of an ncclUniqueId) or "socket" (TCP on any device; cp_id: rank 0's
  /// "host:port"). Rank 0 runs the engine; the others run Executor::run_cp_worker. -1: every
  /// rank in this process.
  int64_t cp_rank = -1;
  std::string cp_id;
  /// In-process group run through the one-process-per-rank protocol (leader + worker loops in
  /// threads): how the protocol is tested without several GPUs.
  bool cp_workers = false;
};

/// Where the memory budget goes (closed form; see MemoryPlan::plan in executor.cc). Everything
/// that grows with the pool is charged per page, everything that grows with the batch is fixed.
struct DSV41RT_API MemoryPlan {
  int64_t budget_bytes = 0;
  int64_t slot_bytes = 0, num_slots = 0;  ///< per-request fixed state
  int64_t page_bytes = 0, num_pages = 0;  ///< compressed KV + index keys of page_tokens positions
  int64_t page_tokens = 0;
  int64_t workspace_bytes_per_page =
      0;                      ///< dequant workspaces + forward buffers that scale with context
  int64_t scratch_bytes = 0;  ///< activations of one forward (token_budget rows) + logits
  int64_t bytes_per_token() const { return page_bytes / page_tokens; }
  std::string describe() const;
};

/// One unit of a batched forward.
struct BatchItem {
  RequestView request;  ///< state; request.length = positions already computed
  const int32_t* tokens = nullptr;
  int64_t n = 0;
  /// [n, vocab] (all_logits) or [1, vocab]; null: nobody reads them, so they are not copied out
  /// (a context-parallel rank other than 0, whose logits equal rank 0's).
  float* logits = nullptr;
  bool all_logits = true;
};

/// What the engine drives: one batched forward over paged state, the pool it allocates from and
/// the counters it reports. CpuExecutor is the FP32 reference; the CUDA executor
/// (cuda_executor.h) computes the same forward on the GPU with the state in device memory.
class DSV41RT_API Executor {
 public:
  virtual ~Executor() = default;
  /// Runs every item; each item's request must hold a slot and pages covering length + n.
  /// Logits are written to the items' host buffers before it returns.
  virtual void forward(std::vector<BatchItem>& items) = 0;
  virtual const ModelPlan& plan() const = 0;
  virtual const StateLayout& layout() const = 0;
  /// The pool's storage is host memory (CPU) or device memory (CUDA); the engine only hands out
  /// and takes back slots and pages.
  virtual model::KvPool& pool() = 0;
  virtual const MemoryPlan& memory_plan() const = 0;
  /// Decisions of the last forward (record_decisions): "topk_L<l>" [rows, index_topk] (sorted,
  /// -1 = none) for index-source layers and "experts_L<l>" [rows, k] (sorted) for every layer,
  /// rows = all tokens of the batch in item order.
  virtual const std::map<std::string, std::vector<int32_t>>& decisions() const = 0;
  virtual DequantWorkspaces& workspaces() = 0;
  /// "cpu" or "cuda:N".
  virtual std::string device() const = 0;
  /// Executor-specific counters (CUDA: graph captures/replays); empty by default.
  virtual std::map<std::string, int64_t> backend_stats() const { return {}; }
  /// Switches a backend option between forwards ("multistream", "cuda_graphs" on CUDA: for A/B
  /// measurements on the same state); throws Error naming the option where it does not apply.
  virtual void set_backend_option(const std::string& name, bool on);
  /// Prefix sharing by copy: writes `src`'s state (its slot, and the pages covering its
  /// `length` positions) into `dst`'s slot and pages, which must already cover that length. The
  /// destination then continues exactly as the source would (same logits for the same tokens).
  virtual void copy_state(const RequestView& src, const RequestView& dst) = 0;
  /// This executor as rank comm.rank() of a context-parallel group (every rank calls it with the
  /// same batch, its own request views and logits buffers): it computes the query rows
  /// g % size == rank of the batch's global rows, all-gathers each layer's normed hidden states
  /// once so every rank writes the whole batch's KV state at its global locations, and gathers
  /// the final hidden states so every rank returns all the logits. Same results as forward().
  virtual void forward_cp(std::vector<BatchItem>& items, comm::Communicator& comm);
  /// The worker loop of a context-parallel rank > 0 in its own process (cp_remote.h): replays
  /// rank 0's calls until it shuts the group down. Throws Error(kUnsupported) elsewhere.
  virtual void run_cp_worker();
};

/// The executor for options.device ("cpu", "cuda", "cuda:N"); throws Error naming the device when
/// it is unknown, or when this build has no CUDA backend or no such GPU is visible.
DSV41RT_API std::shared_ptr<Executor> make_executor(ModelPlan plan, ModelWeights weights,
                                                    EngramTables engram, ExecutorOptions options);

/// The state layout of the options' cache formats (shared by both executors).
std::unique_ptr<StateLayout> make_state_layout(const ModelPlan& plan, const ExecutorOptions& o);

/// Load-time check that the Engram tables match the config (both executors); throws Error.
void check_engram_tables(const ModelConfig& c, const EngramTables& engram);

/// Per layer, the RoPE inverse frequencies (YaRN-scaled where the layer uses it; spec §2.3).
std::vector<std::vector<float>> rope_inv_freqs(const ModelPlan& plan);

/// Appends the rows x k decisions `src` to a decisions() record with each row sorted (the
/// selections compare as sets; shared by both executors).
void append_sorted_rows(const int32_t* src, int64_t rows, int64_t k, std::vector<int32_t>& dst);

/// Argument checks of Executor::copy_state (shared by both executors); throws Error.
void check_copy_state(const model::KvPool& pool, const RequestView& src, const RequestView& dst);

/// The closed-form memory plan (shared by both executors).
MemoryPlan plan_memory(const ModelPlan& plan, const StateLayout& layout, const ExecutorOptions& o);

class DSV41RT_API CpuExecutor final : public Executor {
 public:
  CpuExecutor(ModelPlan plan, ModelWeights weights, EngramTables engram,
              ExecutorOptions options = {});

  void forward(std::vector<BatchItem>& items) override { run(items, nullptr); }
  void forward_cp(std::vector<BatchItem>& items, comm::Communicator& comm) override {
    run(items, &comm);
  }

  const ModelPlan& plan() const override { return plan_; }
  const StateLayout& layout() const override { return *layout_; }
  model::KvPool& pool() override { return *pool_; }
  const MemoryPlan& memory_plan() const override { return memory_; }
  const std::map<std::string, std::vector<int32_t>>& decisions() const override {
    return decisions_;
  }
  DequantWorkspaces& workspaces() override { return workspaces_; }
  std::string device() const override { return "cpu"; }
  void copy_state(const RequestView& src, const RequestView& dst) override;

 private:
  struct Shared;
  struct Item;
  struct Rows;
  void run(std::vector<BatchItem>& items, comm::Communicator* comm);
  void embed(const int32_t* tokens, int64_t n, float* X) const;
  void engram(int layer_pos, const BlockWeights& w, const Item& it, float* X) const;
  void attention(const LayerPlan& layer, const AttentionWeights& w, std::vector<Item>& items,
                 const Rows& rows, const float* x, float* y);
  void compress(const LayerPlan& layer, const AttentionWeights& w, Item& it, const float* x);
  void item_attention(const LayerPlan& layer, const AttentionWeights& w, Item& it, Shared& shared,
                      const float* comp, const float* x, const float* qr, float* q, float* kv,
                      float* y);
  void moe(const LayerPlan& layer, const MoeWeights& w, const float* x, int64_t n, float* y);
  // The projections, with the GPU's precision "bf16" emulated when this forward uses it (inputs
  // rounded to BF16; the same per-forward choice: more than 8 rows).
  void lin(const float* x, const Tensor& w, int64_t m, int64_t k, int64_t n, float* y) const;
  void grouped_lin(const float* x, const Tensor& w, int64_t m, int64_t g, int64_t k, int64_t n,
                   float* y) const;

  ModelPlan plan_;
  ModelWeights weights_;
  EngramTables engram_;
  ExecutorOptions options_;
  std::vector<std::vector<float>> inv_freq_;  // per layer
  std::unique_ptr<StateLayout> layout_;
  MemoryPlan memory_;
  bool bf16_ = false;  // precision "bf16": emulate the GPU tensor-core path
  bool tc_ = false;    // this forward emulates it
  std::unique_ptr<model::KvPool> pool_;
  DequantWorkspaces workspaces_;
  std::map<std::string, std::vector<int32_t>> decisions_;
};

}  // namespace dsv41rt::model
