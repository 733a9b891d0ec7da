// The serving engine: continuous batching over one executor. submit() queues a request; each
// step() schedules a batch (decodes + prefill chunks under the token budget, admitting and
// preempting against the KV pool), runs one batched forward, samples every request whose chunk
// reached its last token, and returns the new tokens and finished requests. With speculation
// (speculation.h), a decoding request's item verifies drafts and may emit several tokens.
//
// Thread-safety: none; one engine thread owns it (the Python binding releases the GIL around
// step(), and the C API serialises calls).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/export.h"
#include "kernels/sampling.h"
#include "runtime/engine/grammar.h"
#include "runtime/engine/scheduler.h"
#include "runtime/engine/speculation.h"
#include "runtime/model/executor.h"
#include "runtime/sequence_state.h"

namespace dsv41rt::engine {

struct EngineConfig {
  int64_t max_num_seqs = 64;             ///< requests running at once (also the pool's slot count)
  int64_t max_num_batched_tokens = 512;  ///< tokens per step
  int64_t max_model_len = 0;             ///< 0 = what the pool holds
  int64_t max_prefill_tokens_while_decoding = 0;  ///< scheduler.h; 0 = no cap
  double max_decode_slowdown = 0;                 ///< scheduler.h; 0 = off
  bool enable_prefix_caching = false;             ///< share cached prefixes (prefix_cache.h)
  int64_t host_cache_bytes = 0;  ///< host tier of the prefix cache (host_tier.h); 0 = off
  /// Speculative decoding (speculation.h); num_speculative_tokens 0 = off.
  SpeculationConfig speculation{};
};

struct GenerationParams {
  int64_t max_new_tokens = 16;
  kernels::SamplingParams sampling;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;  ///< otherwise the model's eos_token_id also stops
  /// Holds the output to a grammar (grammar.h; compiled at submit, before the engine sees it);
  /// the request ends with kStop once the grammar is complete.
  std::shared_ptr<RequestGrammar> grammar;
  /// Prefill role of disaggregated serving: the request ends after its first token and that
  /// output carries its state (RequestOutput::handoff) for a decode engine's submit_handoff;
  /// unless it ends at that token anyway (a stop token, max_new_tokens 1, its grammar).
  bool handoff = false;
};

struct RequestOutput {
  int64_t id = 0;
  std::vector<int32_t> new_tokens;
  std::vector<float> logprobs;                   ///< raw logprob of each new token
  std::vector<std::vector<int32_t>> top_ids;     ///< per new token, when top_logprobs > 0
  std::vector<std::vector<float>> top_logprobs;  ///< per new token
  bool finished = false;
  FinishReason reason = FinishReason::kNone;
  /// Prompt tokens served by the prefix cache (set on a request's first output; -1 elsewhere).
  int64_t cached_tokens = -1;
  /// Set when the request ended on an error of its own (a grammar that could not take the drawn
  /// token): the runtime reports it as FinishReason::kError.
  std::string error;
  /// With GenerationParams::handoff: the request's state after its prompt (sequence_state.h),
  /// set on its only output (finished, reason kLength); empty otherwise.
  std::vector<uint8_t> handoff;
};

struct EngineStats {
  PoolUsage pool;
  SchedulerStats scheduler;
  DequantCounters dequant;
  int64_t steps = 0;
  int64_t tokens_computed = 0;  ///< positions run through the model (recomputation included)
  int64_t tokens_generated = 0;
  PrefixCacheStats prefix_cache;  ///< zeros when prefix caching is off
  SpecDecodeStats spec_decode;    ///< zeros when speculation is off
};

class DSV41RT_API Engine {
 public:
  Engine(std::shared_ptr<model::Executor> executor, EngineConfig config);
  ~Engine();
  Engine(Engine&&) noexcept;
  Engine& operator=(Engine&&) noexcept;

  /// Throws Error naming the bad field (token ids, limits, sampling params). Thread-safe against
  /// a running step (reads only the model's constants and the pool's capacity).
  void check(const std::vector<int32_t>& prompt, const GenerationParams& params) const;
  /// Queues a request (check() first); returns its id (`id` when given: larger than any so far).
  int64_t submit(std::vector<int32_t> prompt, const GenerationParams& params, int64_t id = -1);
  /// A state blob check_handoff accepted, held (not copied) until the request is admitted, and
  /// its decoded view into the blob.
  struct CheckedHandoff {
    std::shared_ptr<const std::vector<uint8_t>> blob;
    SequenceStateView view{};
  };
  /// Throws Error naming what is wrong with a handoff (no pool access): the request as check(),
  /// the first token, the state's size, checksum, model, pool layout and length (the prompt's),
  /// max_new_tokens >= 2 (it counts the first token), no handoff. The blob is handed over: the
  /// result goes to submit_handoff as is, so the state is neither copied nor checksummed again.
  CheckedHandoff check_handoff(const std::vector<int32_t>& prompt, int32_t first_token,
                               std::shared_ptr<const std::vector<uint8_t>> state,
                               const GenerationParams& params) const;
  /// submit_handoff of a state check_handoff accepted for this prompt, first token and params.
  int64_t submit_handoff(std::vector<int32_t> prompt, int32_t first_token, CheckedHandoff state,
                         const GenerationParams& params, int64_t id = -1);
  /// Queues a request a prefill engine handed off: `prompt`, the `first_token` it generated there
  /// and its state blob (RequestOutput::handoff; copied). Admitted in FIFO order like any
  /// request, it takes a slot and the pages of its state, which is written there, and runs from
  /// the first token's decode on: its outputs hold the second token onwards, equal to the request
  /// run here from the start. Checks it as check_handoff does (throws Error naming the problem).
  int64_t submit_handoff(std::vector<int32_t> prompt, int32_t first_token, const uint8_t* state,
                         size_t state_size, const GenerationParams& params, int64_t id = -1);
  /// Runs one step; empty when there is nothing to do. `scheduled`: the ids whose tokens it ran.
  std::vector<RequestOutput> step(std::vector<int64_t>* scheduled = nullptr);
  /// Cancels a waiting or running request and frees its pages at once (kNotFound if unknown).
  void cancel(int64_t id);
  /// Whether `id` is waiting or running (not finished, aborted or unknown).
  bool has_request(int64_t id) const;
  bool idle() const;
  EngineStats stats() const;
  /// Pool invariants over the live requests, the prefix cache and the pool's other owners (the
  /// Runtime's direct sequences); throws Error on a violation.
  void check_invariants(const std::vector<const std::vector<int32_t>*>& other_tables = {},
                        const std::vector<int32_t>& other_slots = {}) const;
  /// Forgets every cached prefix (scheduler.h); pages of running requests stay with them.
  void reset_prefix_cache();
  /// One unreferenced cached page / one snapshot slot back to the pool, for users of the pool
  /// outside the engine (direct sequences); false when the cache has none.
  bool evict_cached_page();
  bool evict_cached_slot();
  model::Executor& executor();

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dsv41rt::engine
