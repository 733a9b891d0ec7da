#include "runtime/engine/engine.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <unordered_set>

#include "core/status.h"
#include "runtime/sequence_state.h"

namespace dsv41rt::engine {

class Engine::Impl {
 public:
  Impl(std::shared_ptr<model::Executor> executor, EngineConfig config)
      : exec_(std::move(executor)),
        config_(config),
        scheduler_(
            SchedulerConfig{std::min(config.max_num_seqs, exec_->pool().usage().slots_total),
                            config.max_num_batched_tokens, config.max_model_len,
                            config.max_prefill_tokens_while_decoding, config.enable_prefix_caching,
                            config.host_cache_bytes, config.max_decode_slowdown},
            exec_->pool(), [this](int32_t from, int32_t to) { copy_slot(from, to); },
            exec_->host_state_copy()),
        spec_(*exec_, config.speculation) {}

  void check(const std::vector<int32_t>& prompt, const GenerationParams& params) const {
    const ModelConfig& c = exec_->plan().config;
    for (size_t i = 0; i < prompt.size(); ++i) {
      DSV41RT_CHECK(prompt[i] >= 0 && prompt[i] < c.vocab_size, "prompt token ", i, " = ",
                    prompt[i], " is outside the vocabulary [0, ", c.vocab_size, ")");
    }
    for (int32_t t : params.stop_token_ids) {
      DSV41RT_CHECK(t >= 0 && t < c.vocab_size, "stop token id ", t, " is outside the vocabulary");
    }
    DSV41RT_CHECK(params.max_new_tokens >= 1, "max_new_tokens must be >= 1, got ",
                  params.max_new_tokens);
    kernels::validate_sampling_params(params.sampling, c.vocab_size);
    scheduler_.check(int64_t(prompt.size()), params.max_new_tokens);
  }

  int64_t submit(std::vector<int32_t> prompt, const GenerationParams& params, int64_t id) {
    check(prompt, params);
    const ModelConfig& c = exec_->plan().config;
    id = scheduler_.submit(std::move(prompt), params.max_new_tokens, id);
    Meta& m = meta_[id];
    m.params = params;
    m.stops.insert(params.stop_token_ids.begin(), params.stop_token_ids.end());
    if (!params.ignore_eos) m.stops.insert(c.eos_token_id);
    return id;
  }

  SequenceStateView check_handoff(const std::vector<int32_t>& prompt, int32_t first_token,
                                  const uint8_t* state, size_t state_size,
                                  const GenerationParams& params) const {
    check(prompt, params);
    const ModelConfig& c = exec_->plan().config;
    DSV41RT_CHECK(first_token >= 0 && first_token < c.vocab_size, "handoff: first token ",
                  first_token, " is outside the vocabulary [0, ", c.vocab_size, ")");
    DSV41RT_CHECK(!params.handoff, "handoff: a handed-off request cannot be handed off again");
    DSV41RT_CHECK(params.max_new_tokens >= 2, "handoff: max_new_tokens ", params.max_new_tokens,
                  " leaves nothing to decode after the first token");
    const SequenceStateView view = check_sequence_state(*exec_, state, state_size);
    DSV41RT_CHECK(view.header.length == int64_t(prompt.size()), "handoff: the state covers ",
                  view.header.length, " positions, the prompt has ", prompt.size(), " tokens");
    return view;
  }

  // The state waits in host memory until admission; `view` points into `blob`.
  int64_t submit_handoff(std::vector<int32_t> prompt, int32_t first_token,
                         std::shared_ptr<const std::vector<uint8_t>> blob,
                         const SequenceStateView& view, const GenerationParams& params,
                         int64_t id) {
    if (params.grammar) {
      DSV41RT_CHECK(params.grammar->accept(first_token),
                    "handoff: the request's grammar cannot take its first token ", first_token);
    }
    model::Executor* exec = exec_.get();
    const int64_t prompt_len = int64_t(prompt.size());
    prompt.push_back(first_token);
    id = scheduler_.submit_computed(
        std::move(prompt), prompt_len, params.max_new_tokens,
        [exec, blob, view](int32_t slot, const std::vector<int32_t>& pages) {
          write_sequence_state(*exec, view, slot, pages.data());
        },
        id);
    const ModelConfig& c = exec_->plan().config;
    Meta& m = meta_[id];
    m.params = params;
    m.stops.insert(params.stop_token_ids.begin(), params.stop_token_ids.end());
    if (!params.ignore_eos) m.stops.insert(c.eos_token_id);
    m.reported_cached = true;  // the prefill engine reported it
    return id;
  }

  std::vector<RequestOutput> step(std::vector<int64_t>* scheduled) {
    std::vector<RequestOutput> outputs;
    for (int64_t id : cancelled_) outputs.push_back(finished_output(id, FinishReason::kAborted));
    cancelled_.clear();
    StepPlan plan = scheduler_.schedule();
    for (int64_t id : plan.preempted) spec_.forget(id);  // recomputed later, captured again
    if (plan.chunks.empty()) return outputs;
    if (scheduled) {
      for (const ScheduledChunk& ch : plan.chunks) scheduled->push_back(ch.request_id);
    }
    const size_t n = plan.chunks.size();
    std::vector<model::BatchItem> batch(n);
    std::vector<model::SampleSpec> specs(n);
    std::vector<kernels::SampledToken> sampled(n);
    std::vector<std::vector<uint32_t>> masks(n);  // grammars' next tokens
    std::vector<std::unique_ptr<Verify>> verifies(n);
    std::vector<std::vector<float>> features(n);  // the drafter's target features per item
    plan_verifies(plan, verifies);  // reserves pages: before any item points at a page table
    KvPool& pool = exec_->pool();
    for (size_t i = 0; i < n; ++i) {
      const ScheduledChunk& ch = plan.chunks[i];
      const SchedRequest& r = scheduler_.request(ch.request_id);
      const Meta& m = meta_.at(ch.request_id);
      model::BatchItem& b = batch[i];
      Verify* v = verifies[i].get();
      b.request = {pool.slot_data(r.slot), r.pages.data(), int64_t(r.pages.size()), ch.start};
      b.tokens = v ? v->fed.data() : r.tokens.data() + ch.start;
      b.n = v ? int64_t(v->fed.size()) : ch.count;
      // A prefill chunk with more prompt after it: V4's MTP layer reads that token at its last row.
      if (!v && !ch.samples && ch.start + ch.count < int64_t(r.tokens.size())) {
        b.mtp_next = r.tokens[size_t(ch.start + ch.count)];
      }
      b.logits = nullptr;  // only the sampled token leaves the device
      if (spec_.needs_features() && speculates(m.params)) b.dspark_features = &features[i];
      tokens_computed_ += b.n;
      if (v) {  // every row's logits: the tokens are drawn on the host (speculation.h)
        b.logits = v->logits.data();
        b.all_logits = true;
        b.undo = &v->undo;
        continue;
      }
      if (!ch.samples) continue;
      // The next token is drawn on the device from the chunk's last row.
      model::SampleSpec& sp = specs[i];
      sp.params = m.params.sampling;
      sp.prompt = r.tokens.data();
      sp.n_prompt = r.prompt_len;
      sp.output = r.tokens.data() + r.prompt_len;
      sp.n_output = r.generated();
      sp.step = uint64_t(r.generated());
      if (RequestGrammar* g = m.params.grammar.get()) {
        masks[i].resize(size_t(kernels::token_mask_words(exec_->plan().config.vocab_size)));
        if (g->next_mask(masks[i].data(), r.generated())) sp.mask = masks[i].data();
      }
      b.sample = &sp;
      b.sampled = &sampled[i];
    }
    const auto forward_start = std::chrono::steady_clock::now();
    exec_->forward(batch);  // returns with the sampled tokens on the host: the step is done
    scheduler_.observe_step(
        plan,
        std::chrono::duration<double>(std::chrono::steady_clock::now() - forward_start).count());
    // The tokens each item emits; verifies are resolved (rejected positions taken back) before
    // complete(), which may snapshot a request's state into the prefix cache.
    std::vector<std::vector<kernels::SampledToken>> emitted(n);
    for (size_t i = 0; i < n; ++i) {
      ScheduledChunk& ch = plan.chunks[i];
      if (verifies[i]) {
        emitted[i] = resolve_verify(ch, *verifies[i]);  // ch.count: the positions kept
      } else if (ch.samples) {
        emitted[i].push_back(std::move(sampled[i]));
      }
      if (batch[i].dspark_features) {
        spec_.keep_features(ch.request_id, ch.start, features[i], ch.count);
      }
    }
    scheduler_.complete(plan);
    for (size_t i = 0; i < n; ++i) {
      if (verifies[i]) scheduler_.trim_pages(plan.chunks[i].request_id);
    }
    ++steps_;
    for (size_t i = 0; i < n; ++i) {
      if (!emitted[i].empty()) outputs.push_back(emit(plan.chunks[i].request_id, emitted[i]));
    }
    return outputs;
  }

  // The output of a request's new tokens; all but the last are already its tokens (accepted
  // drafts, which accept_greedy / accept_sampled / accept_forced end before any stop or the last
  // allowed token).
  RequestOutput emit(int64_t id, const std::vector<kernels::SampledToken>& tokens) {
    Meta& m = meta_.at(id);
    RequestOutput out;
    out.id = id;
    for (const kernels::SampledToken& s : tokens) {
      out.new_tokens.push_back(s.token);
      out.logprobs.push_back(s.logprob);
      if (m.params.sampling.top_logprobs > 0) {
        out.top_ids.push_back(s.top_ids);
        out.top_logprobs.push_back(s.top_logprobs);
      }
      ++tokens_generated_;
    }
    if (!m.reported_cached) {
      out.cached_tokens = scheduler_.request(id).cached;
      m.reported_cached = true;
    }
    const int32_t token = tokens.back().token;
    scheduler_.append_token(id, token);
    const int64_t generated = scheduler_.request(id).generated();
    RequestGrammar* g = m.params.grammar.get();
    if (g && !g->accept(token)) {
      out.reason = FinishReason::kStop;
      out.error = "the request's grammar cannot take the drawn token " + std::to_string(token);
    } else if (m.stops.count(token) || (g && g->terminated())) {
      out.reason = FinishReason::kStop;
    } else if (generated >= m.params.max_new_tokens) {
      out.reason = FinishReason::kLength;
    }
    if (out.reason == FinishReason::kNone && m.params.handoff) {
      const SchedRequest& r = scheduler_.request(id);
      // An executor that cannot export states fails this request, not the engine (nothing
      // was read when it says so); any other error still stops the engine.
      try {
        out.handoff = export_sequence_state(*exec_, r.slot, r.pages.data(), r.computed);
      } catch (const Error& e) {
        if (e.kind() != StatusCode::kUnsupported) throw;
        out.error = std::string("handoff: ") + e.what();
      }
      out.reason = FinishReason::kLength;
    }
    if (out.reason != FinishReason::kNone) {
      out.finished = true;
      scheduler_.finish(id, out.reason);
      meta_.erase(id);
      spec_.forget(id);
    }
    return out;
  }

  bool speculates(const GenerationParams& p) const {
    return spec_.eligible(p.sampling, p.grammar != nullptr, p.handoff);
  }

  // Drafts for the step's greedy decodes, within the step's token budget; a request that gets no
  // drafts or no pages for them decodes as usual (drafts never preempt anyone).
  void plan_verifies(const StepPlan& plan, std::vector<std::unique_ptr<Verify>>& verifies) {
    if (!spec_.drafts_in_step(int64_t(plan.chunks.size()))) return;
    int64_t budget = config_.max_num_batched_tokens;
    for (const ScheduledChunk& ch : plan.chunks) budget -= ch.count;
    const int64_t V = exec_->plan().config.vocab_size;
    for (size_t i = 0; i < plan.chunks.size() && budget >= 1; ++i) {
      const ScheduledChunk& ch = plan.chunks[i];
      const SchedRequest& r = scheduler_.request(ch.request_id);
      const GenerationParams& p = meta_.at(ch.request_id).params;
      // A decode: one position, the request's last known token, past its prompt.
      if (!ch.samples || ch.count != 1 || ch.start < r.prompt_len || !speculates(p)) continue;
      const int64_t k = spec_.planned_length(
          r, std::min({spec_.k(), p.max_new_tokens - r.generated() - 1, budget}));
      if (k < 1) continue;
      Drafts d = spec_.draft(r, k);
      if (d.tokens.empty()) continue;
      if (!scheduler_.reserve_pages(r.id, ch.start + 1 + int64_t(d.tokens.size()))) continue;
      budget -= int64_t(d.tokens.size());
      auto v = std::make_unique<Verify>();
      v->fed.push_back(r.tokens[size_t(ch.start)]);
      v->fed.insert(v->fed.end(), d.tokens.begin(), d.tokens.end());
      v->confidence = std::move(d.confidence);
      v->logits.resize(v->fed.size() * size_t(V));
      verifies[i] = std::move(v);
    }
  }

  // Accepts a verify's tokens, takes its other positions back (Executor::undo) and records the
  // accepted drafts with the scheduler; `ch.count` becomes the positions kept.
  std::vector<kernels::SampledToken> resolve_verify(ScheduledChunk& ch, const Verify& v) {
    const SchedRequest& r = scheduler_.request(ch.request_id);
    const Meta& meta = meta_.at(ch.request_id);
    const auto stops = [&meta](int32_t t) { return meta.stops.count(t) != 0; };
    const int64_t V = exec_->plan().config.vocab_size;
    const kernels::SamplingParams& sp = meta.params.sampling;
    const int64_t k = int64_t(v.fed.size()) - 1;
    std::vector<kernels::SampledToken> out;
    int64_t accepted = 0;
    if (spec_.forced()) {
      // Benchmarks (forced_acceptance): the forced drafts, then the target's token; a stop inside
      // ends the block, and only the drafts emitted count. A bonus token that happens to equal
      // the next draft does not count: the measured acceptance is the forced one.
      const int64_t a = spec_.forced_count(ch.request_id, k);
      out = accept_forced(v, V, sp, r, stops, a);
      accepted = std::min<int64_t>(a, int64_t(out.size()));
    } else {
      out = double(sp.temperature) < 1e-5 ? accept_greedy(v, V, sp, r, stops)
                                          : accept_sampled(v, V, sp, r, stops);
      const int64_t n = int64_t(out.size());
      accepted = n - 1 + (n - 1 < k && out.back().token == v.fed[size_t(n)] ? 1 : 0);
    }
    const int64_t m = int64_t(out.size());
    spec_.count(ch.request_id, k, accepted, v.confidence);
    const int64_t length = ch.start + k + 1;
    if (ch.start + m < length) {
      const model::RequestView view{exec_->pool().slot_data(r.slot), r.pages.data(),
                                    int64_t(r.pages.size()), length};
      exec_->undo(view, v.undo, ch.start + m);
    }
    std::vector<int32_t> kept;
    for (int64_t j = 0; j + 1 < m; ++j) kept.push_back(out[size_t(j)].token);
    if (!kept.empty()) scheduler_.extend_tokens(r.id, kept);
    ch.count = m;
    return out;
  }

  void cancel(int64_t id) {
    DSV41RT_CHECK_CODE(kNotFound, scheduler_.has_request(id), "unknown request ", id);
    scheduler_.abort(id);
    meta_.erase(id);
    spec_.forget(id);
    cancelled_.push_back(id);
  }

  bool has_request(int64_t id) const { return scheduler_.has_request(id); }
  bool idle() const { return scheduler_.idle() && cancelled_.empty(); }

  EngineStats stats() const {
    EngineStats s;
    s.pool = exec_->pool().usage();
    s.scheduler = scheduler_.stats();
    s.dequant = exec_->workspaces().counters();
    s.steps = steps_;
    s.tokens_computed = tokens_computed_;
    s.tokens_generated = tokens_generated_;
    if (const PrefixCache* cache = scheduler_.prefix_cache()) s.prefix_cache = cache->stats();
    s.spec_decode = spec_.stats();
    return s;
  }

  void check_invariants(const std::vector<const std::vector<int32_t>*>& other_tables,
                        const std::vector<int32_t>& other_slots) const {
    scheduler_.check_invariants(other_tables, other_slots);
  }
  void reset_prefix_cache() { scheduler_.reset_prefix_cache(); }
  bool evict_cached_page() { return scheduler_.evict_cached_page(); }
  bool evict_cached_slot() { return scheduler_.evict_cached_slot(); }
  model::Executor& executor() { return *exec_; }

 private:
  struct Meta {
    GenerationParams params;
    std::unordered_set<int32_t> stops;
    bool reported_cached = false;
  };

  // A snapshot's state into a request's slot or back: the slot and the Engram history, no pages.
  void copy_slot(int32_t from, int32_t to) {
    KvPool& pool = exec_->pool();
    exec_->copy_state({pool.slot_data(from), nullptr, 0, 0}, {pool.slot_data(to), nullptr, 0, 0});
  }

  static RequestOutput finished_output(int64_t id, FinishReason reason) {
    RequestOutput out;
    out.id = id;
    out.finished = true;
    out.reason = reason;
    return out;
  }

  std::shared_ptr<model::Executor> exec_;
  EngineConfig config_;
  Scheduler scheduler_;
  Speculator spec_;
  std::map<int64_t, Meta> meta_;
  std::vector<int64_t> cancelled_;
  int64_t steps_ = 0, tokens_computed_ = 0, tokens_generated_ = 0;
};

Engine::Engine(std::shared_ptr<model::Executor> executor, EngineConfig config)
    : impl_(std::make_unique<Impl>(std::move(executor), config)) {}
Engine::~Engine() = default;
Engine::Engine(Engine&&) noexcept = default;
Engine& Engine::operator=(Engine&&) noexcept = default;

void Engine::check(const std::vector<int32_t>& prompt, const GenerationParams& params) const {
  impl_->check(prompt, params);
}
int64_t Engine::submit(std::vector<int32_t> prompt, const GenerationParams& params, int64_t id) {
  return impl_->submit(std::move(prompt), params, id);
}
Engine::CheckedHandoff Engine::check_handoff(const std::vector<int32_t>& prompt,
                                             int32_t first_token,
                                             std::shared_ptr<const std::vector<uint8_t>> state,
                                             const GenerationParams& params) const {
  DSV41RT_CHECK(state != nullptr, "handoff: no state");
  CheckedHandoff checked;
  checked.view = impl_->check_handoff(prompt, first_token, state->data(), state->size(), params);
  checked.blob = std::move(state);
  return checked;
}
int64_t Engine::submit_handoff(std::vector<int32_t> prompt, int32_t first_token,
                               CheckedHandoff state, const GenerationParams& params, int64_t id) {
  DSV41RT_CHECK(state.blob != nullptr, "handoff: no state");
  return impl_->submit_handoff(std::move(prompt), first_token, std::move(state.blob), state.view,
                               params, id);
}
int64_t Engine::submit_handoff(std::vector<int32_t> prompt, int32_t first_token,
                               const uint8_t* state, size_t state_size,
                               const GenerationParams& params, int64_t id) {
  CheckedHandoff checked = check_handoff(
      prompt, first_token, std::make_shared<const std::vector<uint8_t>>(state, state + state_size),
      params);
  return submit_handoff(std::move(prompt), first_token, std::move(checked), params, id);
}
std::vector<RequestOutput> Engine::step(std::vector<int64_t>* scheduled) {
  return impl_->step(scheduled);
}
void Engine::cancel(int64_t id) { impl_->cancel(id); }
bool Engine::has_request(int64_t id) const { return impl_->has_request(id); }
bool Engine::idle() const { return impl_->idle(); }
EngineStats Engine::stats() const { return impl_->stats(); }
void Engine::check_invariants(const std::vector<const std::vector<int32_t>*>& other_tables,
                              const std::vector<int32_t>& other_slots) const {
  impl_->check_invariants(other_tables, other_slots);
}
void Engine::reset_prefix_cache() { impl_->reset_prefix_cache(); }
bool Engine::evict_cached_page() { return impl_->evict_cached_page(); }
bool Engine::evict_cached_slot() { return impl_->evict_cached_slot(); }
model::Executor& Engine::executor() { return impl_->executor(); }

}  // namespace dsv41rt::engine
