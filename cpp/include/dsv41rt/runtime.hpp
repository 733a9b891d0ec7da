// dsv41rt::Runtime — the C++ facade of the runtime: one loaded DeepSeek-V4.1 checkpoint, its
// engine (continuous batching over the paged KV pool) and, by default, its engine thread. The C API
// (dsv41rt.h), the Python module (dsv41rt._core.Runtime) and the server all go through this class.
//
//   dsv41rt::RuntimeOptions o;
//   o.checkpoint = "/models/tiny-v41";
//   dsv41rt::Runtime rt(o);                          // loads, validates, starts the engine thread
//   int64_t id = rt.submit({0, 671, 6102}, {});      // greedy, 16 tokens
//   while (auto out = rt.await(id, std::chrono::seconds(1)))
//     if (out->finished) break;
//
// Thread safety: every member may be called from any thread (the engine runs on its own thread;
// calls hand work to it and never wait for a forward to end, except the direct-sequence calls,
// which run a forward themselves). A callback runs on the engine thread and must return quickly.
// Errors: dsv41rt::Error (core/status.h) with a StatusCode and a message naming what is wrong.
#ifndef DSV41RT_RUNTIME_HPP_
#define DSV41RT_RUNTIME_HPP_

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"  // dsv41rt::Error, StatusCode (installed beside this header)

namespace dsv41rt {

// ---- options (docs/options.md lists every option once: YAML/CLI, Python, C API, default) -----

enum class Precision { kFp32, kBf16, kFp8 };
enum class KvCacheDtype { kAuto, kFloat32 };  ///< the release's cache formats, or FP32 (debug)
enum class CpBackend { kLocal, kNccl, kSocket };

struct PoolOptions {
  int64_t kv_memory = int64_t(256) << 20;  ///< bytes: request slots + token pages + workspaces
  int64_t max_num_seqs = 64;               ///< requests running at once
  int64_t max_num_batched_tokens = 512;    ///< tokens per engine step (prefill chunks + decodes)
  int64_t max_model_len = 0;               ///< prompt + output tokens per request; 0 = the pool
  int64_t page_size = 64;                  ///< positions per KV page (a multiple of every ratio)
  /// prefill tokens an engine step may carry while requests decode; 0 = no cap
  int64_t max_prefill_tokens_while_decoding = 0;
  /// a step carrying prefill while requests decode may take up to this many times a decode-only
  /// step (its prefill tokens capped from measured step times); 0 = off
  double max_decode_slowdown = 0;
  /// reuse the state of prompt prefixes earlier requests computed (docs/design/prefix-cache.md)
  bool enable_prefix_caching = true;
  /// bytes of host memory (pinned on CUDA) the prefix cache keeps pages it evicts in, to bring
  /// them back instead of recomputing them; 0 = off
  int64_t host_cache_memory = 0;
};

struct NumericsOptions {
  Precision precision = Precision::kFp32;
  KvCacheDtype kv_cache_dtype = KvCacheDtype::kAuto;
};

struct DeviceOptions {
  std::string device = "cpu";  ///< "cpu", "cuda" or "cuda:N"
  bool enforce_eager = false;  ///< CUDA: no decode graphs
  bool multistream = true;     ///< CUDA: window store, compressor, indexer, mHC mix side streams
  /// CUDA: the Engram tables in pinned host memory, gathered by the device over PCIe (zero-copy)
  /// instead of copied to device memory.
  bool engram_host_memory = false;
};

struct ParallelOptions {
  int64_t context_parallel_size = 1;  ///< prefill split over this many ranks
  CpBackend context_parallel_backend = CpBackend::kLocal;
  /// Routed experts split over this many ranks (virtual ranks in this process, or one process per
  /// rank; every rank runs every token. CPU: the MoE output combined exactly, logits bitwise those
  /// of 1 rank; CUDA: the ranks' partial outputs summed, 1 rank's up to FP32 summation order).
  int64_t expert_parallel_size = 1;
  /// Attention heads, output groups and the head's vocabulary split over this many ranks
  /// (outputs all-gathered: logits bitwise those of 1 rank, CPU and CUDA). Expert parallelism
  /// inside it: expert_parallel_size 1 or the same size.
  int64_t tensor_parallel_size = 1;
  /// Launchers only (one process per rank): this process's rank (-1: every rank in this
  /// process), the group's rendezvous (NCCL unique id bytes, or rank 0's "host:port"), and the
  /// test mode that runs the one-process-per-rank protocol with the ranks as threads.
  int64_t rank = -1;
  std::string group_id;
  bool worker_threads = false;
};

struct RuntimeOptions {
  std::string checkpoint;     ///< directory: config.json, *.safetensors, engram_tables.st
  std::string engram_tables;  ///< Engram inputs file; empty = <checkpoint>/engram_tables.st
  PoolOptions pool;
  NumericsOptions numerics;
  DeviceOptions device;
  ParallelOptions parallel;
  bool record_decisions = false;  ///< keep each forward's decisions (Decisions; debug)
  /// Load the DSpark drafter (spec 4.2) with the weights, for draft_greedy on direct sequences,
  /// which then keep the target features of their last positions (their forwards run eagerly).
  /// Not with tensor or expert parallelism or one process per context-parallel rank.
  bool load_drafter = false;
  /// Speculative decoding in the engine (vLLM's speculative-config, method "dspark"): draft
  /// tokens the DSpark drafter proposes per decode step, verified in the step's forward
  /// (docs/design/dspark.md). 0 = off; -1 = self-tuned per request and step, up to the
  /// drafter's block (runtime/engine/draft_length.h). Loads the drafter (as load_drafter); the
  /// checkpoint must have one.
  int64_t num_speculative_tokens = 0;
  /// No drafts in an engine step that runs more than this many requests (vLLM's
  /// speculative-config key disable_by_batch_size); 0 = never.
  int64_t speculative_disable_by_batch_size = 0;
  /// Benchmarking / testing hook (not a serving option): with num_speculative_tokens > 0 the
  /// drafts of request `id` (its ids as this Runtime numbers them) come from here instead of the
  /// DSpark drafter, which is then not loaded: up to `k` tokens after `tokens` (the prompt, then
  /// the generated ones; the last not yet fed). Called on the engine's thread, once per
  /// speculating request and step. E.g. the known continuation, whose acceptance
  /// forced_acceptance then fixes: bench/spec_decode_engine_bench.py.
  std::function<std::vector<int32_t>(int64_t id, const std::vector<int32_t>& tokens, int64_t k)>
      draft_source;
  /// Benchmarking hook (not a serving option), NOT lossless: with num_speculative_tokens > 0,
  /// every verify of request `id` accepts exactly clamp(forced_acceptance(id, drafted), 0,
  /// drafted) of its `drafted` drafts whatever the model says, then emits the model's own token
  /// after them (greedy and sampling requests alike; a stop token or max_new_tokens still ends
  /// the output inside the block). The spec-decode counters record the forced counts, so the
  /// measured acceptance is the forced one however the verify forward's numerics differ from plain
  /// decode's (SGLang's SGLANG_SIMULATE_ACC_LEN). Called on the engine's thread, once per verify.
  /// With draft_source giving the known continuation: bench/spec_decode_engine_bench.py.
  std::function<int64_t(int64_t id, int64_t drafted)> forced_acceptance;
  /// true: an engine thread runs steps whenever there is work; false: the caller runs them with
  /// step() (scripting, deterministic tests).
  bool engine_thread = true;
  std::function<void(int64_t done, int64_t total)> progress;  ///< while loading, per block
};

// ---- requests ---------------------------------------------------------------------------------

struct SamplingParams {
  float temperature = 0.0f;  ///< < 1e-5: greedy
  int32_t top_k = 0;         ///< 0 or -1: off
  float top_p = 1.0f;
  float min_p = 0.0f;
  float presence_penalty = 0.0f, frequency_penalty = 0.0f, repetition_penalty = 1.0f;
  uint64_t seed = 0;         ///< same seed, same tokens, whatever else is running
  int32_t top_logprobs = 0;  ///< alternatives returned per token, [0, 20]
};

/// Grammar-constrained decoding (runtime/engine/grammar.h): the output must match this grammar;
/// needs the tokenizer's vocabulary (Runtime::set_grammar_vocab).
struct GrammarParams {
  /// "" (none), "json_object", "json_schema", "structural_tag" (xgrammar's JSON format), "ebnf"
  /// (root rule "root") or "regex"
  std::string kind;
  std::string text;  ///< the schema / structural tag / grammar / pattern ("json_object": unused)
  /// The output is free until this token is drawn and held to the grammar after it (e.g. the
  /// end of the reasoning, "</think>"); -1: from the first token.
  int32_t start_token = -1;
  /// With start_token: the token is forced once this many tokens came without it; -1: never.
  int64_t start_within = -1;
};

struct RequestParams {
  int64_t max_new_tokens = 16;
  SamplingParams sampling;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;  ///< otherwise the model's end-of-sequence token also stops
  GrammarParams grammar;
  /// Prefill role of disaggregated serving: the request ends after its first token, whose output
  /// carries the request's state (RequestOutput::handoff) for another runtime's submit_handoff;
  /// unless it ends at that token anyway (a stop token, max_new_tokens 1, its grammar).
  bool handoff = false;
};

enum class FinishReason { kNone, kLength, kStop, kAborted, kError };

/// New tokens of one request (from one step, or gathered since the last await).
struct RequestOutput {
  int64_t id = 0;
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;                   ///< raw logprob of each token
  std::vector<std::vector<int32_t>> top_ids;     ///< per token, when top_logprobs > 0
  std::vector<std::vector<float>> top_logprobs;  ///< per token
  bool finished = false;
  FinishReason reason = FinishReason::kNone;
  std::string error;               ///< reason kError: why the request could not go on
  int64_t first_scheduled_ns = 0;  ///< steady clock: when the first step running it began
  /// prompt tokens served by the prefix cache: set (>= 0) on the output that carries the
  /// request's first token, -1 on the others
  int64_t cached_tokens = -1;
  /// RequestParams::handoff: the request's state after its prompt (a checksummed blob for
  /// submit_handoff), on its finished output; empty otherwise.
  std::vector<uint8_t> handoff;
};

// ---- introspection ----------------------------------------------------------------------------

struct PoolStats {
  int64_t pages_total = 0, pages_used = 0, slots_total = 0, slots_used = 0, bytes_total = 0;
  int64_t page_size = 0, page_bytes = 0, slot_bytes = 0;
  int64_t workspace_bytes_per_page = 0, scratch_bytes = 0;
  /// held only by the prefix cache (given back on demand, so not in pages_used / slots_used)
  int64_t pages_cached = 0, slots_cached = 0;
};

struct SchedulerStats {
  int64_t waiting = 0, running = 0, preemptions = 0, admitted = 0, finished = 0, aborted = 0;
  int64_t max_waiting_seen = 0;
};

/// The executor's counters (zero where they do not apply to the device).
struct BackendStats {
  int64_t weight_bytes = 0;       ///< device memory held by the weights
  int64_t weight_host_bytes = 0;  ///< pinned host memory the device reads (engram_host_memory)
  /// Of weight_host_bytes, the checkpoint file's own pages read in place (the page cache holds
  /// them once per host) rather than a pinned copy per rank.
  int64_t weight_host_in_place_bytes = 0;
  int64_t d2h_bytes = 0;  ///< bytes copied from the device to the host by forwards
  int64_t eager_forwards = 0, graph_captures = 0, graph_replays = 0, graph_updates = 0;
  /// Kernel -> kernel edges of captured graphs made programmatic (Switch::kProgrammaticLaunch).
  int64_t programmatic_edges = 0;
  int64_t graphs = 0;           ///< decode graphs held
  int64_t last_forward_us = 0;  ///< device time of the last forward
  bool multistream = false, cuda_graphs = false, tensor_cores = false;
  int64_t cp_size = 1, cp_forwards = 0, cp_processes = 0;
  int64_t tp_size = 1, ep_size = 1;  ///< tensor- and expert-parallel ranks
  /// The last context-parallel forward (switch kCpTiming): sums over layers, microseconds.
  int64_t cp_layers_timed = 0, cp_q_projection_us = 0, cp_all_gather_us = 0, cp_overlap_us = 0;
};

/// Prefix cache counters, in tokens as vLLM counts them (each request once, at its admission).
struct PrefixCacheStats {
  int64_t queries = 0, hits = 0;
  int64_t evicted_pages = 0, evicted_snapshots = 0;
  /// host tier (host_cache_memory): nodes whose page is on the host now, host bytes in use, and
  /// totals of pages and of snapshots (evicted alone) copied there on eviction, and of pages and
  /// snapshots copied back for a hit
  int64_t host_pages = 0, host_bytes = 0, offloaded_pages = 0, restored_pages = 0;
  int64_t offloaded_snapshots = 0, restored_snapshots = 0;
};
struct DequantStats {
  int64_t dequant_calls = 0, reuse_hits = 0, rows_dequantised = 0, reallocations = 0;
};

/// vLLM's spec-decode counters (num_speculative_tokens > 0).
struct SpecDecodeStats {
  int64_t drafts = 0, draft_tokens = 0, accepted_tokens = 0;
  std::vector<int64_t> accepted_per_pos;  ///< [k]: drafts whose token at that index was accepted
};

struct Stats {
  PoolStats pool;
  SchedulerStats scheduler;
  DequantStats dequant;
  BackendStats backend;
  int64_t steps = 0, tokens_computed = 0, tokens_generated = 0;
  PrefixCacheStats prefix_cache;
  SpecDecodeStats spec_decode;
};

/// Discrete decisions of the last forward (record_decisions): per layer, rows x k (each row
/// sorted): the indexer's top-k (index-source layers; -1 = none) and the routed experts. With
/// them, per layer, the window-KV rows (rows x head_dim, FP32) as they enter their cache rounding:
/// an oracle can tell a rounding that went the other way at a near-tie (both sides' inputs agree
/// to FP32 noise) from a real difference. And, for each DSpark target layer (V4.1 with DSpark
/// weights), the drafter's target features: rows x hidden, the mean over the hc streams of the
/// layer's input after its Engram update (spec 4.2).
struct Decisions {
  int64_t rows = 0;
  std::map<int, std::vector<int32_t>> topk, experts;
  std::map<int, int64_t> topk_width, experts_width;
  std::map<int, std::vector<float>> window_kv;
  int64_t window_kv_width = 0;
  std::map<int, std::vector<float>> dspark_features;
  int64_t hidden = 0;
  /// DeepSeek-V4 MTP layer s (loaded with load_drafter): the final streams fed in [rows, hc * H]
  /// (before the hyper-head) and its logits [rows, V], every query row.
  std::map<int, std::vector<float>> mtp_streams, mtp_logits;
  int64_t mtp_streams_width = 0, mtp_logits_width = 0;
};

/// Switches for A/B measurements between forwards.
/// kAttentionInPlace: sparse attention reads the quantised caches as stored in decode-sized
/// forwards (off: unpacks them to FP32 first; the same results).
/// kProgrammaticLaunch: captured decode graphs chain their kernels by programmatic dependent
/// launch (each kernel's launch overlaps the previous one's tail; the same results).
enum class Switch {
  kMultistream,
  kCudaGraphs,
  kTensorCores,
  kCpTiming,
  kAttentionInPlace,
  kProgrammaticLaunch
};

/// A block the DSpark drafter proposes (Runtime::draft_greedy).
struct DraftBlock {
  std::vector<int32_t> tokens;    ///< dspark_block_size greedy drafts, in order
  std::vector<float> confidence;  ///< per token, the confidence head's logit (uncalibrated)
};

struct ModelInfo {
  int64_t vocab_size = 0;
  int32_t eos_token_id = 0;
  std::string device;  ///< "cpu" or "cuda:N"
};

// ---- the runtime ------------------------------------------------------------------------------

class DSV41RT_API Runtime {
 public:
  using Callback = std::function<void(const RequestOutput&)>;

  /// Loads and validates the checkpoint (once), builds the executor and the engine; starts the
  /// engine thread unless options.engine_thread is false. Throws Error naming the bad option,
  /// file or tensor.
  explicit Runtime(RuntimeOptions options);
  ~Runtime();  ///< shutdown()
  Runtime(Runtime&&) noexcept;
  Runtime& operator=(Runtime&&) noexcept;
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  // Requests (continuous batching). Outputs go to the callback when one is given (on the engine
  // thread), else they are kept for await()/await_any().
  int64_t submit(std::vector<int32_t> prompt, const RequestParams& params, Callback on_output = {});
  /// Continues a request another runtime of the same model and pool layout prefilled (decode
  /// role): its `prompt`, the `first_token` it generated there and its `state`
  /// (RequestOutput::handoff); `params` as the request's (max_new_tokens counts the first token,
  /// so >= 2). Error(kInvalidArgument) here naming what is wrong with the state (size, checksum,
  /// model, pool layout, prompt length) or the params. Queued like submit(); at admission it
  /// takes a slot and the pages of its state and decodes from the first token on: its outputs
  /// hold the second token onwards, equal to the request run here from the start.
  int64_t submit_handoff(std::vector<int32_t> prompt, int32_t first_token,
                         std::vector<uint8_t> state, const RequestParams& params,
                         Callback on_output = {});
  /// The outputs of `id` gathered since the last call, waiting up to `timeout` for something new
  /// (nullopt when nothing came). After the finished output the id is forgotten.
  std::optional<RequestOutput> await(int64_t id, std::chrono::milliseconds timeout);
  /// Gathered outputs of every request without a callback (one entry per request), waiting up to
  /// `timeout` for at least one.
  std::vector<RequestOutput> await_any(std::chrono::milliseconds timeout);
  /// Ends a waiting or running request (its pages are freed); its consumer sees kAborted. With
  /// an engine thread, `wait` returns only once that is done (at most one step later); without,
  /// the request ends at once. Unknown id: Error(kNotFound).
  void cancel(int64_t id, bool wait = true);
  /// engine_thread = false: runs one engine step on this thread and returns its outputs.
  std::vector<RequestOutput> step();
  bool idle() const;
  /// Cancels every request and stops the engine thread; awaiting threads return. Idempotent.
  void shutdown();

  // Direct sequences, outside the scheduler (scoring, parity tests, benchmarks): a sequence holds
  // a slot and pages of the same pool; forward() runs its next tokens at once.
  int64_t open_sequence();
  /// Logits of every new position (all_logits) or of the last, into `logits` ([n or 1, vocab]).
  /// `undoable`: keep what these positions overwrite, so that rollback() can take them back.
  void forward(int64_t seq, const int32_t* tokens, int64_t n, bool all_logits, float* logits,
               bool undoable = false);
  /// Takes back the last `r` positions of `seq`'s latest forward, which ran undoable: `seq`
  /// continues bitwise as if they had never run (window rings, pending compressor rows, Engram
  /// history restored; compressed entries and index keys past the new length dropped, the pages
  /// past it freed). A forward of n positions can be taken back by any r <= n when n <= the
  /// model's sliding window, else only as a whole (r = n); rollbacks may repeat down to where
  /// that forward began; a decode, fork or another forward starts over. Error(kNotFound) for an
  /// unknown sequence, kInvalidArgument for r < 0, kOutOfRange past rollback_limit(seq) (or a
  /// partial rollback of a long forward), kUnsupported under context/tensor/expert parallelism.
  void rollback(int64_t seq, int64_t r);
  /// The most positions rollback(seq, r) takes back now (0: none).
  int64_t rollback_limit(int64_t seq) const;
  /// One greedy speculative step (spec 7.3-7.4): `last_token` is `seq`'s newest token, not fed
  /// yet (the previous step's last output), `draft` k proposed tokens after it. Runs ONE forward
  /// over [last_token, draft...] (k + 1 <= the model's sliding window), keeps the longest prefix
  /// of `draft` that the target's greedy tokens equal, takes the other positions back exactly
  /// (rollback), and returns those drafts followed by the target's own next token (the bonus):
  /// 1 .. k + 1 tokens, bitwise those plain greedy decoding gives from `last_token`; the last is
  /// the next call's `last_token`. Errors as forward() / rollback(); kInvalidArgument for a
  /// draft too long or a token outside the vocabulary (before anything runs).
  std::vector<int32_t> verify_greedy(int64_t seq, int32_t last_token,
                                     const std::vector<int32_t>& draft);
  /// The DSpark drafter's greedy block after `seq` (options.load_drafter), with each token's
  /// confidence logit (the input a self-tuning draft length reads): anchored at
  /// `last_token` (the newest token, not fed yet), reading the target features `seq`'s forwards
  /// captured for its last sliding_window positions; dspark_block_size tokens proposed for the
  /// positions after `last_token`, each the argmax of its row with the Markov head of the token
  /// before it. Error(kUnsupported) without a drafter, kOutOfRange when `seq` lacks those
  /// features (an imported sequence: feed it sliding_window positions first).
  DraftBlock draft_greedy(int64_t seq, int32_t last_token);
  /// A new sequence holding a copy of `seq`'s state: it continues exactly as `seq` would.
  int64_t fork(int64_t seq);
  /// One token for each sequence in one batched forward; logits [seqs, vocab].
  void decode(const std::vector<int64_t>& seqs, const int32_t* tokens, float* logits);
  /// The same step as the engine runs it: each sequence's greedy next token and its raw logprob
  /// drawn on the device (`next`, `logprobs` [seqs]); no logits leave the device.
  void decode_greedy(const std::vector<int64_t>& seqs, const int32_t* tokens, int32_t* next,
                     float* logprobs);
  void close_sequence(int64_t seq);
  /// `seq`'s cache state as one self-describing, checksummed blob (the request slot's state and
  /// the pages covering its length), for another runtime of the same model and pool layout
  /// (prefill/decode handoff). Error(kUnsupported) under context parallelism.
  std::vector<uint8_t> export_sequence(int64_t seq);
  /// A new sequence from a blob export_sequence made: it continues exactly as the exported one
  /// would. A truncated or corrupted blob, or one from another model or pool layout, is refused
  /// (Error naming the mismatch) before any pool memory is taken.
  int64_t import_sequence(const uint8_t* data, size_t size);

  ModelInfo info() const;
  Stats stats() const;
  Decisions decisions() const;
  std::string describe_pool() const;
  void check_invariants() const;
  void set_switch(Switch which, bool on);
  void set_dequant_reuse(bool on);
  void reset_dequant_counters();
  /// Forgets every cached prefix: its pages and snapshot slots go back to the pool (pages that
  /// running requests share stay with them). A no-op when prefix caching is off.
  void reset_prefix_cache();
  /// Context-parallel rank > 0 in its own process: replays rank 0's calls until it shuts down.
  void run_cp_worker();
  /// The vocabulary grammars compile against (RequestParams::grammar): tokens[i] the bytes token i
  /// decodes to ("" for a control token no grammar may produce; ids past the list up to the
  /// model's vocabulary likewise), stop_token_ids the tokens that end a completed grammar (the
  /// end-of-sequence token). Replaces an earlier one; requests already submitted keep theirs.
  /// Throws Error when this build has no grammar support (grammar_available()).
  void set_grammar_vocab(const std::vector<std::string>& tokens,
                         const std::vector<int32_t>& stop_token_ids);
  /// Whether this build can constrain outputs to grammars (built with xgrammar).
  static bool grammar_available();

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dsv41rt

#endif  // DSV41RT_RUNTIME_HPP_
