// Scheduler policy (see scheduler.h). Decisions the header leaves open, settled here:
//   - config().max_model_len reports the resolved limit: 0 becomes the pool's capacity in tokens.
//   - max_num_seqs above the pool's slot count is not an error; admission also needs a free slot.
//   - A request counts as decoding when exactly one known token is not yet computed (this includes
//     the last token of a prompt or of a recompute); it gets its single token in phase 1.
//   - Preemption victims are the most recently admitted running request, and only when it was
//     admitted after the one asking for pages (the header's rule). A victim already planned earlier
//     in the same step loses its chunk (the budget is refunded), so a request id is never both in
//     plan.chunks and plan.preempted.
//   - A request preempted during a step is not re-admitted in that same step (it waits at the
//     front of the queue, so admission stops for this step), which avoids thrashing.
//   - complete() ignores chunks of requests that were finished or aborted after schedule().
//   - max_new_tokens must be >= 1; an engine wanting "0 new tokens" handles that without the
//     scheduler.
//   - Prefix cache: a hit leaves at least one token to compute (the one the next token is sampled
//     after); the prefix-cache counters count each request once, at its first admission (a
//     re-admission after preemption looks the cache up again but is not counted); a publish that
//     finds no free slot even after evicting a snapshot indexes the pages alone.
#include "runtime/engine/scheduler.h"

#include <algorithm>

#include "core/status.h"

namespace dsv41rt::engine {

Scheduler::Scheduler(SchedulerConfig config, KvPool& pool, SlotCopier copier,
                     model::HostStateCopy* host_copy)
    : config_(config), pool_(pool), copier_(std::move(copier)) {
  DSV41RT_CHECK(config_.max_num_seqs >= 1, "scheduler: max_num_seqs must be >= 1, got ",
                config_.max_num_seqs);
  DSV41RT_CHECK(config_.max_num_batched_tokens >= 1,
                "scheduler: max_num_batched_tokens must be >= 1, got ",
                config_.max_num_batched_tokens);
  DSV41RT_CHECK(config_.max_model_len >= 0, "scheduler: max_model_len must be >= 0, got ",
                config_.max_model_len);
  DSV41RT_CHECK(config_.host_cache_bytes >= 0, "host-cache-memory must be >= 0 bytes, got ",
                config_.host_cache_bytes);
  DSV41RT_CHECK(config_.max_prefill_tokens_while_decoding >= 0,
                "scheduler: max_prefill_tokens_while_decoding must be >= 0, got ",
                config_.max_prefill_tokens_while_decoding);
  if (config_.max_decode_slowdown != 0) cap_model_.emplace(config_.max_decode_slowdown);
  const PoolUsage u = pool_.usage();
  DSV41RT_CHECK(u.pages_total >= 1 && u.slots_total >= 1,
                "scheduler: the KV pool needs at least one page and one slot (has ", u.pages_total,
                " pages, ", u.slots_total, " slots)");
  if (config_.max_model_len == 0)
    config_.max_model_len = u.pages_total * pool_.geometry().page_tokens;
  DSV41RT_CHECK(config_.host_cache_bytes == 0 || config_.enable_prefix_caching,
                "host-cache-memory (", config_.host_cache_bytes,
                " bytes) needs enable-prefix-caching");
  DSV41RT_CHECK(config_.host_cache_bytes == 0 || host_copy != nullptr,
                "host-cache-memory is not supported by this executor (the context-parallel "
                "drivers keep a request's state on several ranks)");
  if (config_.enable_prefix_caching) {
    DSV41RT_CHECK(static_cast<bool>(copier_),
                  "scheduler: enable_prefix_caching needs a slot copier");
    cache_ = std::make_unique<PrefixCache>(pool_, config_.host_cache_bytes, host_copy);
  }
}

Scheduler::~Scheduler() = default;

void Scheduler::check(int64_t prompt_len, int64_t max_new_tokens) const {
  DSV41RT_CHECK(prompt_len >= 1, "scheduler: empty prompt");
  DSV41RT_CHECK(max_new_tokens >= 1, "scheduler: max_new_tokens must be >= 1, got ",
                max_new_tokens);
  const int64_t total = prompt_len + max_new_tokens;
  DSV41RT_CHECK_CODE(kOutOfRange, total <= config_.max_model_len, "scheduler: prompt of ",
                     prompt_len, " tokens + max_new_tokens ", max_new_tokens, " = ", total,
                     " exceeds max_model_len ", config_.max_model_len);
  const int64_t pages = pool_.page_count();  // capacity: fixed, unlike the usage counters
  DSV41RT_CHECK_CODE(kOutOfRange, pool_.pages_for(total) <= pages, "scheduler: prompt of ",
                     prompt_len, " tokens + max_new_tokens ", max_new_tokens, " = ", total,
                     " tokens can never fit in the KV pool (", pages, " pages x ",
                     pool_.geometry().page_tokens, " = ", pages * pool_.geometry().page_tokens,
                     " tokens)");
}

int64_t Scheduler::submit(std::vector<int32_t> prompt, int64_t max_new_tokens, int64_t id) {
  const int64_t prompt_len = static_cast<int64_t>(prompt.size());
  check(prompt_len, max_new_tokens);
  if (id < 0) id = next_id_;
  DSV41RT_CHECK(id >= next_id_, "scheduler: request id ", id, " is not new (next is ", next_id_,
                ")");
  next_id_ = id + 1;
  SchedRequest& r = requests_[id];
  r.id = id;
  r.tokens = std::move(prompt);
  r.prompt_len = prompt_len;
  r.max_new_tokens = max_new_tokens;
  waiting_.push_back(id);
  return id;
}

int64_t Scheduler::submit_computed(std::vector<int32_t> tokens, int64_t prompt_len,
                                   int64_t max_new_tokens, StateWriter write, int64_t id) {
  const int64_t known = int64_t(tokens.size());
  DSV41RT_CHECK(
      prompt_len >= 1 && known > prompt_len && known - prompt_len < max_new_tokens && write,
      "scheduler: a computed request needs a prompt, at least one generated token, "
      "room for another and a state writer (prompt ",
      prompt_len, ", tokens ", known, ", max_new_tokens ", max_new_tokens, ")");
  std::vector<int32_t> prompt(tokens.begin(), tokens.begin() + prompt_len);
  id = submit(std::move(prompt), max_new_tokens, id);
  SchedRequest& r = requests_.at(id);
  r.tokens = std::move(tokens);
  r.computed_state = std::move(write);
  return id;
}

bool Scheduler::preempt_newer_than(int64_t asker_id) {
  // running_ is in admission order and holds the asker: a newer request is after it.
  if (running_.empty() || running_.back() == asker_id) return false;
  const int64_t victim = running_.back();
  SchedRequest& r = requests_.at(victim);
  release(r);  // frees slot + pages, removes from running_
  r.computed = 0;
  r.admit_seq = -1;
  r.running = false;
  ++r.preemptions;
  ++stats_.preemptions;
  waiting_.push_front(victim);
  return true;
}

void Scheduler::release(SchedRequest& r) {
  r.snapshot_at = -1;
  r.decoded_snapshot = -1;
  if (r.slot >= 0) {
    pool_.free_slot(r.slot);
    r.slot = -1;
  }
  pool_.free_pages(r.pages);
  if (r.running) {
    running_.erase(std::find(running_.begin(), running_.end(), r.id));
  } else {
    auto it = std::find(waiting_.begin(), waiting_.end(), r.id);
    if (it != waiting_.end()) waiting_.erase(it);
  }
}

StepPlan Scheduler::schedule() {
  StepPlan plan;
  stats_.max_waiting_seen = std::max(stats_.max_waiting_seen, int64_t(waiting_.size()));
  int64_t budget = config_.max_num_batched_tokens;

  // Prefill tokens this step may still take (steps 2 and 3): the step budget, capped once a decode
  // is scheduled when max_prefill_tokens_while_decoding is set.
  int64_t prefill_cap = -1;  // -1: no cap
  int64_t prefill_used = 0;
  std::vector<int64_t> decoding;  // requests with a decode chunk in this plan
  auto prefill_room = [&] {
    return prefill_cap < 0 ? budget : std::min(budget, prefill_cap - prefill_used);
  };

  // Gets pages for tokens [0, end) of running request `r`, preempting newer requests as needed;
  // false (no chunk for `r` this step) when none is left. A victim that already has a chunk in this
  // plan loses it (and its budget comes back).
  auto secure_pages = [&](SchedRequest& r, int64_t end) {
    while (!pool_.ensure_pages(r.pages, end)) {
      if (cache_ && cache_->evict_page()) continue;  // cached pages go before running requests
      if (!preempt_newer_than(r.id)) return false;
      const int64_t victim = waiting_.front();
      plan.preempted.push_back(victim);
      for (auto it = plan.chunks.begin(); it != plan.chunks.end();) {
        if (it->request_id == victim) {
          budget += it->count;
          if (std::find(decoding.begin(), decoding.end(), victim) == decoding.end()) {
            prefill_used -= it->count;
          }
          it = plan.chunks.erase(it);
        } else {
          ++it;
        }
      }
    }
    return true;
  };
  auto add_chunk = [&](const SchedRequest& r, int64_t count, bool decode) {
    const int64_t known = static_cast<int64_t>(r.tokens.size());
    plan.chunks.push_back({r.id, r.computed, count, r.computed + count == known});
    budget -= count;
    if (decode) {
      decoding.push_back(r.id);
    } else {
      prefill_used += count;
    }
  };

  // 1. Decodes (one token each), admission order. running_ may shrink under us: iterate a copy.
  const std::vector<int64_t> order = running_;
  for (int64_t id : order) {
    if (budget < 1) break;
    SchedRequest& r = requests_.at(id);
    if (!r.running) continue;  // preempted earlier in this step
    if (int64_t(r.tokens.size()) - r.computed != 1) continue;
    if (secure_pages(r, r.computed + 1)) add_chunk(r, 1, /*decode=*/true);
  }
  if (!decoding.empty()) {
    if (config_.max_prefill_tokens_while_decoding > 0) {
      prefill_cap = config_.max_prefill_tokens_while_decoding;
    }
    const int64_t adaptive = adaptive_prefill_cap(int64_t(decoding.size()));
    if (adaptive >= 0) prefill_cap = prefill_cap < 0 ? adaptive : std::min(prefill_cap, adaptive);
  }
  // 2. Prefill chunks of running requests, admission order. When the queue head could be admitted
  // and its whole prompt fits in half the prefill room, that much room is kept for it: a short
  // request is not held back for the whole prefill of a long one (issue 23 D2). A long head gets no
  // reserve (running prefills keep going first), so long prompts do not prefill side by side and
  // preempt each other's progress under page pressure (sharing the room with every contender did:
  // the randomized stress test livelocked). In such a joining step the running prefills also take
  // at most 1/8 of the room, so the step that gives the short request its first token is a short
  // one (a long chunk's forward time would otherwise come on top of the wait for the step in
  // flight); they lose that step's remaining room once per joining request.
  constexpr int64_t kJoinStepShare = 8;
  const int64_t max_num_seqs = std::min(config_.max_num_seqs, pool_.usage().slots_total);
  int64_t reserve = 0;
  if (!waiting_.empty() && int64_t(running_.size()) < max_num_seqs) {
    const SchedRequest& head = requests_.at(waiting_.front());
    const int64_t need =  // one token for a request that brings its state
        head.computed_state ? 1 : int64_t(head.tokens.size()) - head.computed;
    if (need <= prefill_room() / 2) reserve = need;
  }
  const int64_t running_cap =
      reserve > 0 ? std::max<int64_t>(prefill_room() / kJoinStepShare, 1) : prefill_room();
  for (int64_t id : order) {
    if (prefill_room() - reserve < 1) break;
    SchedRequest& r = requests_.at(id);
    if (!r.running) continue;
    const int64_t remaining = int64_t(r.tokens.size()) - r.computed;
    if (remaining <= 1) continue;
    const int64_t count =
        chunk_limit(r, std::min({prefill_room() - reserve, running_cap, remaining}));
    if (secure_pages(r, r.computed + count)) add_chunk(r, count, /*decode=*/false);
  }
  // 3. Admissions, strictly FIFO, without preempting anyone.
  while (prefill_room() >= 1 && !waiting_.empty() && int64_t(running_.size()) < max_num_seqs) {
    const int64_t id = waiting_.front();
    if (std::find(plan.preempted.begin(), plan.preempted.end(), id) != plan.preempted.end()) {
      break;  // preempted in this very step: wait for the next one
    }
    SchedRequest& r = requests_.at(id);
    if (!cache_ && pool_.free_slot_count() < 1) break;
    // A request computed elsewhere brings its state (no lookup): only its last token runs.
    const bool brings_state = bool(r.computed_state);
    if (brings_state) r.computed = int64_t(r.tokens.size()) - 1;
    const PrefixHit hit = cache_ && !brings_state ? admit_lookup(r) : PrefixHit{};
    auto wait = [&] {  // not admitted: the shared pages go back until the next try
      pool_.free_pages(r.pages);
      r.computed = 0;
      r.snapshot_at = -1;
    };
    const int64_t count =
        chunk_limit(r, std::min(prefill_room(), int64_t(r.tokens.size()) - r.computed));
    bool paged = false;
    while (!(paged = pool_.ensure_pages(r.pages, r.computed + count)) && cache_ &&
           cache_->evict_page()) {
    }
    if (!paged) {
      wait();
      break;
    }
    // A slot: a free one; else another snapshot gives its slot back; else the request takes the
    // hit's snapshot slot over (it holds the very state the request starts from: no copy).
    if (pool_.free_slot_count() < 1 && !cache_->evict_snapshot(hit.snapshot_slot)) {
      if (hit.snapshot_slot < 0) {
        wait();
        break;
      }
      cache_->release_snapshot(hit.snapshot_slot);
      r.slot = hit.snapshot_slot;
    } else {
      r.slot = pool_.alloc_slot();
      if (hit.snapshot_slot >= 0) restore_snapshot(r, hit);
    }
    if (brings_state) {
      r.computed_state(r.slot, r.pages);
      r.computed_state = nullptr;  // a later preemption recomputes
    }
    if (cache_ && r.cached < 0 && !brings_state) {
      cache_->record_query(int64_t(r.tokens.size()), hit.tokens);
    }
    if (r.cached < 0) r.cached = hit.tokens;
    r.running = true;
    r.admit_seq = next_admit_++;
    waiting_.pop_front();
    running_.push_back(id);
    ++stats_.admitted;
    add_chunk(r, count, /*decode=*/false);
  }
  for (const ScheduledChunk& c : plan.chunks) {  // victims' chunks are gone from both
    if (std::find(decoding.begin(), decoding.end(), c.request_id) != decoding.end()) {
      ++plan.decodes;
    } else {
      plan.prefill_tokens += c.count;
    }
  }
  return plan;
}

void Scheduler::observe_step(const StepPlan& plan, double seconds) {
  if (cap_model_) cap_model_->observe(plan.decodes, plan.prefill_tokens, seconds);
}

int64_t Scheduler::adaptive_prefill_cap(int64_t decodes) const {
  return cap_model_ ? cap_model_->cap(decodes) : -1;
}

int64_t Scheduler::chunk_limit(const SchedRequest& r, int64_t count) const {
  // A prefill chunk stops at the snapshot boundary: the slot holds the state there only between
  // that step and the next.
  if (r.snapshot_at > r.computed) return std::min(count, r.snapshot_at - r.computed);
  return count;
}

// Shares the pages of the request's longest cached prefix and sets where it will publish. The
// caller restores the snapshot once the request has its slot.
PrefixHit Scheduler::admit_lookup(SchedRequest& r) {
  const int64_t known = int64_t(r.tokens.size());
  const PrefixHit hit = cache_->lookup(r.tokens, known - 1);
  pool_.retain_pages(hit.pages);
  r.pages = hit.pages;
  r.computed = hit.tokens;
  const int64_t P = pool_.geometry().page_tokens;
  const int64_t boundary = (known - 1) / P * P;  // the last one before the last known token
  r.snapshot_at = boundary > r.computed ? boundary : -1;
  return hit;
}

void Scheduler::restore_snapshot(SchedRequest& r, const PrefixHit& hit) {
  try {
    copier_(hit.snapshot_slot, r.slot);
  } catch (...) {  // the request goes back to waiting, holding nothing
    pool_.free_slot(r.slot);
    r.slot = -1;
    pool_.free_pages(r.pages);
    r.computed = 0;
    r.snapshot_at = -1;
    throw;
  }
}

// Indexes the request's full pages up to its snapshot boundary and copies its slot (the state at
// that boundary, as the step that reached it left it) into a snapshot slot: a free one, or, when
// `may_evict`, the least recently used snapshot's.
void Scheduler::publish(SchedRequest& r, bool may_evict) {
  const int64_t boundary = r.snapshot_at;
  r.snapshot_at = -1;
  int32_t snapshot = -1;
  if (!cache_->has_snapshot(r.tokens, boundary)) {
    if (pool_.free_slot_count() < 1 && may_evict) cache_->evict_snapshot();
    snapshot = pool_.alloc_slot();  // -1: the pages are indexed without a snapshot
  }
  try {
    if (snapshot >= 0) copier_(r.slot, snapshot);
    if (!cache_->insert(r.tokens, boundary, r.pages, snapshot) && snapshot >= 0) {
      pool_.free_slot(snapshot);
    }
  } catch (...) {
    if (snapshot >= 0) pool_.free_slot(snapshot);
    throw;
  }
}

// A decode step reached a page boundary: the slot holds the state there until the next step.
void Scheduler::publish_decoded(SchedRequest& r) {
  const int64_t previous = r.decoded_snapshot;
  r.snapshot_at = r.computed;
  publish(r, /*may_evict=*/false);  // opportunistic: never at another snapshot's expense
  r.decoded_snapshot = r.computed;
  // One decode-time snapshot per request: the later one serves every prompt the earlier one did
  // that continues this conversation.
  if (previous > 0) cache_->drop_snapshot(r.tokens, previous);
}

void Scheduler::reset_prefix_cache() {
  if (cache_) cache_->reset();
}

void Scheduler::complete(const StepPlan& plan) {
  for (const ScheduledChunk& c : plan.chunks) {
    auto it = requests_.find(c.request_id);
    if (it == requests_.end()) continue;  // finished or aborted since schedule()
    SchedRequest& r = it->second;
    DSV41RT_CHECK(r.running, "scheduler: complete() for request ", r.id, ", which is not running");
    DSV41RT_CHECK(
        c.start == r.computed && c.count >= 1 && c.start + c.count <= int64_t(r.tokens.size()),
        "scheduler: chunk [", c.start, ", ", c.start + c.count, ") of request ", r.id,
        " does not follow its computed prefix (", r.computed, " of ", r.tokens.size(), " tokens)");
    r.computed += c.count;
    if (!cache_) continue;
    if (r.snapshot_at == r.computed) {
      publish(r, /*may_evict=*/true);
    } else if (c.count == 1 && r.computed >= r.prompt_len &&
               r.computed % pool_.geometry().page_tokens == 0) {
      publish_decoded(r);
    }
  }
}

void Scheduler::append_token(int64_t id, int32_t token) {
  auto it = requests_.find(id);
  DSV41RT_CHECK_CODE(kNotFound, it != requests_.end(), "scheduler: no request ", id);
  SchedRequest& r = it->second;
  DSV41RT_CHECK(r.running && r.computed == int64_t(r.tokens.size()), "scheduler: request ", id,
                " has no sampled position to append to (computed ", r.computed, " of ",
                r.tokens.size(), " tokens)");
  DSV41RT_CHECK_CODE(kOutOfRange, r.generated() < r.max_new_tokens, "scheduler: request ", id,
                     " already generated max_new_tokens ", r.max_new_tokens);
  r.tokens.push_back(token);
}

bool Scheduler::reserve_pages(int64_t id, int64_t end) {
  SchedRequest& r = requests_.at(id);
  DSV41RT_CHECK(r.running, "scheduler: reserve_pages for request ", id, ", which is not running");
  while (!pool_.ensure_pages(r.pages, end)) {
    if (!(cache_ && cache_->evict_page())) return false;  // drafts never preempt anyone
  }
  return true;
}

void Scheduler::trim_pages(int64_t id) {
  SchedRequest& r = requests_.at(id);
  const size_t keep = size_t(pool_.pages_for(r.computed));
  if (r.pages.size() <= keep) return;
  // Pages past the computed positions are the request's own: the prefix cache indexes only pages
  // up to a published boundary, which is never past computed.
  std::vector<int32_t> tail(r.pages.begin() + std::ptrdiff_t(keep), r.pages.end());
  r.pages.resize(keep);
  pool_.free_pages(tail);
}

void Scheduler::extend_tokens(int64_t id, const std::vector<int32_t>& tokens) {
  SchedRequest& r = requests_.at(id);
  DSV41RT_CHECK(r.running && r.generated() + int64_t(tokens.size()) < r.max_new_tokens,
                "scheduler: request ", id, " cannot take ", tokens.size(),
                " accepted tokens (generated ", r.generated(), " of ", r.max_new_tokens, ")");
  r.tokens.insert(r.tokens.end(), tokens.begin(), tokens.end());
}

void Scheduler::finish(int64_t id, FinishReason reason) {
  auto it = requests_.find(id);
  DSV41RT_CHECK_CODE(kNotFound, it != requests_.end(), "scheduler: no request ", id);
  release(it->second);
  requests_.erase(it);
  if (reason == FinishReason::kAborted) {
    ++stats_.aborted;
  } else {
    ++stats_.finished;
  }
}

void Scheduler::abort(int64_t id) {
  DSV41RT_CHECK_CODE(kNotFound, requests_.count(id) != 0, "scheduler: abort of unknown request ",
                     id);
  finish(id, FinishReason::kAborted);
}

const SchedRequest& Scheduler::request(int64_t id) const {
  auto it = requests_.find(id);
  DSV41RT_CHECK_CODE(kNotFound, it != requests_.end(), "scheduler: no request ", id);
  return it->second;
}

bool Scheduler::has_request(int64_t id) const { return requests_.count(id) != 0; }

bool Scheduler::idle() const { return requests_.empty(); }

SchedulerStats Scheduler::stats() const {
  SchedulerStats s = stats_;
  s.waiting = static_cast<int64_t>(waiting_.size());
  s.running = static_cast<int64_t>(running_.size());
  return s;
}

void Scheduler::check_invariants(const std::vector<const std::vector<int32_t>*>& other_tables,
                                 const std::vector<int32_t>& other_slots) const {
  std::vector<const std::vector<int32_t>*> tables(other_tables);
  std::vector<int32_t> slots(other_slots);
  tables.reserve(requests_.size());
  for (const auto& [id, r] : requests_) {
    tables.push_back(&r.pages);
    const int64_t known = static_cast<int64_t>(r.tokens.size());
    DSV41RT_CHECK_CODE(kInternal, 0 <= r.computed && r.computed <= known, "scheduler: request ", id,
                       " computed ", r.computed, " of ", known, " tokens");
    DSV41RT_CHECK_CODE(kInternal, known <= r.prompt_len + r.max_new_tokens, "scheduler: request ",
                       id, " holds ", known, " tokens, over its limit");
    DSV41RT_CHECK_CODE(kInternal,
                       r.snapshot_at < 0 || (cache_ && r.running && r.snapshot_at > r.computed &&
                                             r.snapshot_at < known &&
                                             r.snapshot_at % pool_.geometry().page_tokens == 0),
                       "scheduler: request ", id, " would publish at ", r.snapshot_at,
                       " (computed ", r.computed, " of ", known, ")");
    if (r.running) {
      DSV41RT_CHECK_CODE(kInternal, r.slot >= 0 && r.admit_seq >= 0, "scheduler: running request ",
                         id, " has no slot/admission");
      DSV41RT_CHECK_CODE(kInternal, int64_t(r.pages.size()) >= pool_.pages_for(r.computed),
                         "scheduler: request ", id, " computed ", r.computed, " tokens but holds ",
                         r.pages.size(), " pages");
      slots.push_back(r.slot);
    } else {
      DSV41RT_CHECK_CODE(kInternal, r.slot < 0 && r.pages.empty() && r.computed == 0,
                         "scheduler: waiting request ", id, " holds pool storage or state");
    }
  }
  DSV41RT_CHECK_CODE(kInternal, running_.size() + waiting_.size() == requests_.size(),
                     "scheduler: ", running_.size(), " running + ", waiting_.size(),
                     " waiting != ", requests_.size(), " live requests");
  int64_t last_seq = -1;
  for (int64_t id : running_) {
    auto it = requests_.find(id);
    DSV41RT_CHECK_CODE(kInternal, it != requests_.end() && it->second.running,
                       "scheduler: running list holds ", id, ", which is not running");
    DSV41RT_CHECK_CODE(kInternal, it->second.admit_seq > last_seq,
                       "scheduler: running list is not in admission order at ", id);
    last_seq = it->second.admit_seq;
  }
  for (int64_t id : waiting_) {
    auto it = requests_.find(id);
    DSV41RT_CHECK_CODE(kInternal, it != requests_.end() && !it->second.running,
                       "scheduler: queue holds ", id, ", which is not waiting");
  }
  std::vector<std::vector<int32_t>> cached_pages;
  if (cache_) cache_->owners(cached_pages, slots);
  for (const std::vector<int32_t>& t : cached_pages) tables.push_back(&t);
  pool_.check_invariants(tables, slots);
}

}  // namespace dsv41rt::engine
