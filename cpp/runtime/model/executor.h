// What the engine drives: one batched forward over paged state (the V4.1 forward of
// model_runner.h on a device Backend), the pool it allocates from and the counters it reports.
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
#include "core/export.h"
#include "dsv41rt/runtime.hpp"  // BackendStats, Decisions, Switch
#include "kernels/sampling.h"
#include "runtime/dequant_workspace.h"
#include "runtime/model/host_state_copy.h"
#include "runtime/model/kv_pool.h"
#include "runtime/model/layer_plan.h"
#include "runtime/model/memory_plan.h"
#include "runtime/model/state_layout.h"
#include "runtime/model/weights.h"

namespace dsv41rt::model {

struct UndoRecord;   // runtime/model/state_undo.h
struct DraftInputs;  // runtime/model/draft_runner.h
struct DraftOutputs;

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
  int64_t kv_memory = 256ll << 20;
  int64_t max_num_seqs = 64;
  int64_t page_tokens = 64;
  /// Tokens per forward the engine will schedule (sizes the activation scratch in the budget).
  int64_t max_num_batched_tokens = 512;
  /// The longest request (prompt + generated) the engine admits; 0 = the whole pool. Sizes the
  /// indexer's score scratch (max_num_batched_tokens queries x the entries of one request): charged
  /// once when set, per page of the pool when not (a request may then hold every page).
  int64_t max_model_len = 0;
  /// "cpu" (the FP32 reference executor) or "cuda" / "cuda:N" (the GPU executor).
  std::string device = "cpu";
  /// CUDA only: run the window-KV store, the compressor and the indexer on side streams (off:
  /// everything on the main stream, same results).
  bool multistream = true;
  /// CUDA only: keep the Engram tables in pinned host memory, read by the device's gathers over
  /// PCIe (zero-copy), instead of device memory.
  bool engram_host_memory = false;
  /// CUDA only: replay captured CUDA graphs for decode batches (off: always eager).
  bool cuda_graphs = true;
  /// GEMM precision. "fp32": every projection and expert in FP32 (the reference's numerics; the
  /// device weights are the checkpoint's stored bytes, decoded exactly). "bf16": projections and
  /// experts take BF16-rounded inputs with FP32 accumulation - on CUDA the serving mode (decode
  /// kernels up to 64 rows, tensor-core GEMMs above), on the CPU its emulation (the reference the
  /// GPU path is tested against). Results then depend on the batch at BF16 rounding level.
  /// "fp8": as "bf16", except that the inputs of matrices the checkpoint stores FP8 / FP4 (and
  /// the MoE's hidden units) are quantised to FP8 E4M3 in 1 x 32 blocks with power-of-two scales:
  /// the official inference numerics (spec 5.2).
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
  /// Tensor and expert parallelism (docs/design/parallelism.md): attention heads, output groups
  /// and the head's vocabulary split over tp_size ranks; routed experts over ep_size ranks (1 or
  /// tp_size when both are > 1). Virtual ranks over LocalComm in one process, each running every
  /// token; 1 and 1 = off.
  int64_t tp_size = 1, ep_size = 1;
  /// Set by the group for each rank's executor: the group's communicator (not owned; null = not a
  /// rank of a tensor/expert-parallel group).
  comm::Communicator* group_comm = nullptr;
};

/// The next token of a request, drawn on the device from its last row's logits
/// (kernels/sampling.h: same seed, logits, history and step => same token on every backend).
struct SampleSpec {
  kernels::SamplingParams params;
  const int32_t* prompt = nullptr;  ///< penalty inputs: the prompt and the tokens generated
  int64_t n_prompt = 0;
  const int32_t* output = nullptr;
  int64_t n_output = 0;
  uint64_t step = 0;  ///< tokens the request generated before this one
  /// The tokens this draw may take (kernels/sampling.h token masks: token_mask_words(vocab)
  /// words), e.g. a grammar's next-token mask; null: every token. A forward with a mask runs
  /// eagerly (not as a decode graph).
  const uint32_t* mask = nullptr;
};

/// One unit of a batched forward.
struct BatchItem {
  RequestView request;  ///< state; request.length = positions already computed
  const int32_t* tokens = nullptr;
  int64_t n = 0;
  /// [n, vocab] (all_logits) or [1, vocab]; null: nobody reads them, so they are neither
  /// computed nor copied out (a prefill chunk that does not sample, a context-parallel rank
  /// other than 0).
  float* logits = nullptr;
  bool all_logits = true;
  /// Draw the next token after this item's last row (only the token, its logprob and the
  /// requested top alternatives leave the device) into *sampled.
  const SampleSpec* sample = nullptr;
  kernels::SampledToken* sampled = nullptr;
  /// Keep what this item's positions overwrite in its slot state (state_undo.h), so that
  /// Executor::undo can take any number of them back afterwards (speculative verification).
  /// Null: nothing kept (no cost). Executors that cannot keep it refuse the forward.
  UndoRecord* undo = nullptr;
  /// This item's rows of the DSpark target features [n, T * H] (host; T target layers in their
  /// config order, the drafter's input: Decisions::dspark_features), filled by the forward.
  /// Null: not computed. Only where has_drafter().
  std::vector<float>* dspark_features = nullptr;
  /// DeepSeek-V4 MTP (an executor holding the MTP layer): the token after this item's last row
  /// when the item does not sample (the next prompt token of a chunked prefill). Negative and
  /// not sampling: the forward is refused after the backbone ran (the MTP ring would miss it).
  int32_t mtp_next = -1;
};

class DSV41RT_API Executor {
 public:
  virtual ~Executor() = default;
  /// Runs every item; each item's request must hold a slot and pages covering length + n.
  /// Logits and sampled tokens are in the items' host buffers when it returns.
  virtual void forward(std::vector<BatchItem>& items) = 0;
  virtual const ModelPlan& plan() const = 0;
  virtual const StateLayout& layout() const = 0;
  /// The pool's storage is host memory (CPU) or device memory (CUDA); the engine only hands out
  /// and takes back slots and pages.
  virtual model::KvPool& pool() = 0;
  virtual const MemoryPlan& memory_plan() const = 0;
  /// Decisions of the last forward (record_decisions): per index-source layer the top-k and per
  /// layer the routed experts, rows = this rank's query rows of the batch in item order.
  virtual const Decisions& decisions() const = 0;
  virtual DequantWorkspaces& workspaces() = 0;
  /// "cpu" or "cuda:N".
  virtual std::string device() const = 0;
  /// Backend counters (weight bytes, device-to-host bytes, CUDA graph captures/replays, ...).
  virtual BackendStats backend_stats() const = 0;
  /// Switches a backend option between forwards (A/B measurements on the same state); throws
  /// Error naming the switch where it does not apply (CUDA graphs and streams on the CPU).
  virtual void set_switch(Switch which, bool on) = 0;
  /// Prefix sharing by copy: writes `src`'s state (its slot, and the pages covering its
  /// `length` positions) into `dst`'s slot and pages, which must already cover that length. The
  /// destination then continues exactly as the source would (same logits for the same tokens).
  virtual void copy_state(const RequestView& src, const RequestView& dst) = 0;
  /// Takes `request` (request.length: its current length) back to `length` positions from
  /// `record`, which a forward of that request with BatchItem::undo filled (the rule:
  /// state_undo.h; Error(kOutOfRange) outside it). The slot state and Engram history become
  /// bitwise those of the shorter request; the caller gives back the pages past `length`.
  /// Error(kUnsupported) where not built (context, tensor and expert parallel groups).
  virtual void undo(const RequestView& request, const UndoRecord& record, int64_t length);
  /// Whether the DSpark drafter was loaded with the weights (ExecutorOptions::drafter).
  virtual bool has_drafter() const { return false; }
  /// DeepSeek-V4: the MTP layer runs after every forward (its logits in decisions(); loaded with
  /// load_drafter). Its last row per item reads the item's next token: callers that do not
  /// sample give the greedy one (runtime_sequences.cc) or BatchItem::mtp_next.
  virtual bool has_mtp() const { return false; }
  /// One greedily drafted block (DraftRunner::run_greedy) over this executor's backend and
  /// weights; Error(kUnsupported) without a drafter.
  virtual void draft_greedy(const DraftInputs& in, DraftOutputs& out);
  /// Moves pages and slot states between the pool and host memory (the prefix cache's host
  /// tier), or null where that is not supported (the context-parallel drivers: their state is
  /// spread over several ranks' pools).
  virtual HostStateCopy* host_state_copy() { return nullptr; }
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

/// Argument checks of Executor::copy_state; throws Error.
void check_copy_state(const model::KvPool& pool, const RequestView& src, const RequestView& dst);

}  // namespace dsv41rt::model
