// Continuous-batching scheduler (policy only; the engine runs the model). Each step it decides
// which request chunks run under a token budget, owns admission against the KV pool, and preempts
// when the pool runs out mid-generation.
//
// Policy, per step (schedule()):
//   1. Running requests that are decoding get one token each (in admission order).
//   2. Running requests still prefilling continue in chunks (admission order) while budget remains.
//   3. Waiting requests are admitted FIFO while budget, a free slot and the pages for their next
//      chunk are available; a request is never admitted out of FIFO order.
//   When step 1 scheduled any decode, steps 2 and 3 together take at most
//   max_prefill_tokens_while_decoding tokens (0 = no cap beyond the step budget): a prefill chunk
//   lengthens the step every decoding request waits on, so this bounds inter-token latency while
//   prompts arrive, at the cost of their time to first token. max_decode_slowdown caps them
//   instead (or as well) by time: as many as keep the step within that many times a decode-only
//   step, learned from the step times the engine reports (prefill_cap_model.h).
//   Each scheduled chunk's pages are allocated before the step. If a running request cannot get a
//   page, the most recently admitted running request is preempted (its slot and pages freed, its
//   computed tokens dropped; it returns to the FRONT of the queue and later recomputes prompt +
//   generated tokens), repeatedly, until the page is available - but only requests admitted after
//   the asker: when none is left, the asker gets no chunk this step and keeps what it holds. So the
//   oldest running request always progresses (it fits the pool alone: submit checks that), which
//   rules out two long requests preempting each other forever (a newer one preempting an older
//   one did that: the randomized stress test livelocked at seed 3275109705).
// A request whose prompt + max_new_tokens exceed max_model_len, or could never fit in the whole
// pool, is rejected at submit with an Error naming the limit.
//
// With enable_prefix_caching (prefix_cache.h, docs/design/prefix-cache.md), admission first
// looks the request's tokens up: the pages of the longest cached prefix that ends at a snapshot
// are shared (one more reference each), the snapshot is copied into the request's new slot
// (through the slot copier the engine installs), and only the rest is computed. A request
// publishes its state at its snapshot boundary, the last page boundary before its last known
// token: its prefill chunk stops there, and after that step its full pages are indexed and its
// slot copied into a snapshot slot. While decoding it publishes again at each page boundary it
// reaches, replacing its previous decode-time snapshot (the next turn of a conversation then hits
// through the answer, not only the prompt). Under pool pressure the cache gives back unreferenced
// pages (least recently used first) before anyone is preempted, and snapshot slots before an
// admission waits for a slot.
// With host_cache_bytes, pages the cache evicts go to its host tier and come back on a lookup that
// reaches them (prefix_cache.h).
//
// Thread-safety: none; owned by the engine thread.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/export.h"
#include "runtime/engine/prefill_cap_model.h"
#include "runtime/engine/prefix_cache.h"
#include "runtime/model/kv_pool.h"

namespace dsv41rt::engine {

using model::KvPool;
using model::PoolUsage;

struct SchedulerConfig {
  int64_t max_num_seqs = 64;             ///< running requests at once (<= pool slots)
  int64_t max_num_batched_tokens = 512;  ///< tokens per step (prefill chunks + decodes)
  int64_t max_model_len = 0;  ///< max prompt + generated tokens per request (0 = pool capacity)
  int64_t max_prefill_tokens_while_decoding = 0;  ///< prefill tokens per step with decodes; 0 = off
  bool enable_prefix_caching = false;  ///< share cached prefixes across requests (needs a copier)
  /// Bytes of host memory the prefix cache keeps evicted pages and snapshots in (0 = no host
  /// tier; needs prefix caching and a host copier).
  int64_t host_cache_bytes = 0;
  /// A step with prefill chunks beside decodes may take up to this many times a decode-only step:
  /// its prefill tokens are capped by a model of measured step times (prefill_cap_model.h,
  /// observe_step()); 0 = off. Both caps apply when both are set.
  double max_decode_slowdown = 0;
};

enum class FinishReason { kNone, kLength, kStop, kAborted };

struct SchedRequest {
  int64_t id = 0;
  std::vector<int32_t> tokens;  ///< prompt followed by the tokens generated so far
  int64_t prompt_len = 0;
  int64_t max_new_tokens = 0;
  int64_t computed = 0;  ///< leading tokens whose state is in the cache
  int32_t slot = -1;
  std::vector<int32_t> pages;
  int64_t admit_seq = -1;  ///< order of (latest) admission; -1 while waiting
  int64_t preemptions = 0;
  bool running = false;
  int64_t cached = -1;  ///< tokens served by the prefix cache at the first admission (-1 before)
  int64_t snapshot_at = -1;  ///< boundary where this request publishes to the prefix cache, or -1
  int64_t decoded_snapshot = -1;  ///< boundary of its latest snapshot taken while decoding, or -1
  /// submit_computed: writes the state of tokens[0, size - 1) at admission (then cleared).
  std::function<void(int32_t slot, const std::vector<int32_t>& pages)> computed_state;

  int64_t generated() const { return int64_t(tokens.size()) - prompt_len; }
};

/// One unit of work of a step: run tokens[start, start + count) of a request. `samples` is true
/// when the chunk ends at the last known token, so the model's output there yields a new token.
struct ScheduledChunk {
  int64_t request_id = 0;
  int64_t start = 0;
  int64_t count = 0;
  bool samples = false;
};

struct StepPlan {
  std::vector<ScheduledChunk> chunks;
  /// Requests preempted while planning this step: the engine must forget their cached state
  /// (their slot and pages are already back in the pool).
  std::vector<int64_t> preempted;
  int64_t decodes = 0;         ///< decode chunks among `chunks`
  int64_t prefill_tokens = 0;  ///< tokens of the other chunks
};

struct SchedulerStats {
  int64_t waiting = 0, running = 0;
  int64_t preemptions = 0;  ///< total since start
  int64_t admitted = 0;     ///< admissions (re-admissions after preemption included)
  int64_t finished = 0, aborted = 0;
  int64_t max_waiting_seen = 0;  ///< largest queue length observed at a schedule()
};

class DSV41RT_API Scheduler {
 public:
  /// Copies the state of the slot `from` into the slot `to` (the executor's copy_state with no
  /// pages): how a snapshot is taken and how it is restored into a request.
  using SlotCopier = std::function<void(int32_t from, int32_t to)>;

  /// `copier` is required when config.enable_prefix_caching is set; `host_copy` (outliving the
  /// scheduler) when config.host_cache_bytes > 0 too.
  Scheduler(SchedulerConfig config, KvPool& pool, SlotCopier copier = {},
            model::HostStateCopy* host_copy = nullptr);
  ~Scheduler();

  /// Throws Error (kInvalidArgument / kOutOfRange) naming the problem for an empty prompt,
  /// max_new_tokens < 1, or a request that cannot fit. Reads only what never changes (limits,
  /// pool capacity), so another thread may call it while the engine thread schedules.
  void check(int64_t prompt_len, int64_t max_new_tokens) const;
  /// Queues a request (check() first); returns its id: `id` when given (it must be larger than
  /// every id so far), else the next one.
  int64_t submit(std::vector<int32_t> prompt, int64_t max_new_tokens, int64_t id = -1);

  /// Writes a request's computed state into its new slot and pages (submit_computed).
  using StateWriter = std::function<void(int32_t slot, const std::vector<int32_t>& pages)>;
  /// A request whose first tokens were computed elsewhere (a prefill server's handoff): `tokens`
  /// = prompt (prompt_len) + the tokens generated there, the state of all but the last of them
  /// written by `write` into the slot and pages it gets at admission. It waits in the queue like
  /// any request (FIFO, no prefix-cache lookup) and then runs from its last token's decode; if
  /// preempted later, it recomputes like any other. Error as submit(), and for inconsistent sizes.
  int64_t submit_computed(std::vector<int32_t> tokens, int64_t prompt_len, int64_t max_new_tokens,
                          StateWriter write, int64_t id = -1);

  /// Plans the next step (allocating slots/pages, possibly preempting). Empty when idle.
  StepPlan schedule();

  /// After the engine ran `plan`: marks the chunks' tokens computed.
  void complete(const StepPlan& plan);
  /// The engine ran `plan` in `seconds` (its forward, wall clock): what max_decode_slowdown's
  /// cap learns from. No-op when that option is off.
  void observe_step(const StepPlan& plan, double seconds);
  /// The prefill cap max_decode_slowdown gives a step with `decodes` decode chunks: 0 = a probe
  /// (decode-only) step, -1 = no cap (off, or nothing measured yet).
  int64_t adaptive_prefill_cap(int64_t decodes) const;
  /// Appends a sampled token to a request (after complete()).
  void append_token(int64_t id, int32_t token);

  // Speculative decoding (engine/speculation.h): a decode chunk that verifies drafts runs more
  // positions than the scheduler planned. The engine reserves their pages, takes the rejected
  // positions back itself (Executor::undo), then records the accepted ones here.
  /// Grows a running request's pages to cover `end` positions without preempting anyone (cached
  /// pages may be evicted); false, changing nothing, when the pool has too few.
  bool reserve_pages(int64_t id, int64_t end);
  /// Gives back a running request's pages past those its computed positions need.
  void trim_pages(int64_t id);
  /// Appends tokens whose positions the step's chunk also ran (accepted drafts), before
  /// complete() is told the chunk's longer count; the request's last token stays the sampled one.
  void extend_tokens(int64_t id, const std::vector<int32_t>& tokens);
  /// Finishes a request (length / stop): frees its slot and pages at once.
  void finish(int64_t id, FinishReason reason);
  /// Aborts a waiting or running request; frees its pages at once. Throws Error for unknown ids.
  void abort(int64_t id);

  const SchedRequest& request(int64_t id) const;  ///< throws Error for unknown ids
  bool has_request(int64_t id) const;
  bool idle() const;
  SchedulerStats stats() const;
  const SchedulerConfig& config() const { return config_; }

  /// Pool invariants over the live requests, the prefix cache and the pool's other owners
  /// (`other_tables`, `other_slots`: the Runtime's direct sequences) (KvPool::check_invariants);
  /// throws Error.
  void check_invariants(const std::vector<const std::vector<int32_t>*>& other_tables = {},
                        const std::vector<int32_t>& other_slots = {}) const;

  /// The prefix cache, or null when prefix caching is off.
  const PrefixCache* prefix_cache() const { return cache_.get(); }
  /// Storage the prefix cache gives back for users of the pool outside the scheduler (direct
  /// sequences): one unreferenced page, or one snapshot slot. False when it has none.
  bool evict_cached_page() { return cache_ && cache_->evict_page(); }
  bool evict_cached_slot() { return cache_ && cache_->evict_snapshot(); }
  /// Forgets every cached prefix (its pages and snapshot slots go back to the pool; pages running
  /// requests share stay with them). No-op when prefix caching is off.
  void reset_prefix_cache();

 private:
  void release(SchedRequest& r);
  bool preempt_newer_than(int64_t asker_id);
  int64_t chunk_limit(const SchedRequest& r, int64_t count) const;
  PrefixHit admit_lookup(SchedRequest& r);
  void restore_snapshot(SchedRequest& r, const PrefixHit& hit);
  void publish(SchedRequest& r, bool may_evict);
  void publish_decoded(SchedRequest& r);

  SchedulerConfig config_;
  KvPool& pool_;
  SlotCopier copier_;
  std::unique_ptr<PrefixCache> cache_;
  std::optional<PrefillCapModel> cap_model_;  // max_decode_slowdown > 0
  std::map<int64_t, SchedRequest> requests_;
  std::deque<int64_t> waiting_;
  std::vector<int64_t> running_;  // admission order
  int64_t next_id_ = 1, next_admit_ = 0;
  SchedulerStats stats_;
};

}  // namespace dsv41rt::engine
