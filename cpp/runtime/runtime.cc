// dsv41rt::Runtime (include/dsv41rt/runtime.hpp): the engine, its thread and the request
// bookkeeping. Two locks: `engine_mu_` guards the engine and the executor (held for a whole step,
// i.e. a forward), `mu_` guards the inbox, the deliveries and the flags (held briefly), so submit,
// await and stats never wait for a forward. The engine thread sleeps on a condition variable and
// is woken by submit/cancel/shutdown: no polling.
#include "dsv41rt/runtime.hpp"

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "core/status.h"
#include "runtime/runtime_load.h"
#include "runtime/runtime_sequences.h"

namespace dsv41rt {
namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

engine::GenerationParams generation_params(const RequestParams& p) {
  engine::GenerationParams g;
  g.max_new_tokens = p.max_new_tokens;
  const SamplingParams& s = p.sampling;
  g.sampling.temperature = s.temperature;
  g.sampling.top_k = s.top_k;
  g.sampling.top_p = s.top_p;
  g.sampling.min_p = s.min_p;
  g.sampling.presence_penalty = s.presence_penalty;
  g.sampling.frequency_penalty = s.frequency_penalty;
  g.sampling.repetition_penalty = s.repetition_penalty;
  g.sampling.seed = s.seed;
  g.sampling.top_logprobs = s.top_logprobs;
  g.stop_token_ids = p.stop_token_ids;
  g.ignore_eos = p.ignore_eos;
  g.handoff = p.handoff;
  return g;
}

FinishReason reason_of(engine::FinishReason r) {
  switch (r) {
    case engine::FinishReason::kNone:
      return FinishReason::kNone;
    case engine::FinishReason::kLength:
      return FinishReason::kLength;
    case engine::FinishReason::kStop:
      return FinishReason::kStop;
    case engine::FinishReason::kAborted:
      return FinishReason::kAborted;
  }
  return FinishReason::kError;
}

// Appends `more` (one step's output) to the outputs gathered for a consumer.
void gather(RequestOutput& into, RequestOutput&& more) {
  into.tokens.insert(into.tokens.end(), more.tokens.begin(), more.tokens.end());
  into.logprobs.insert(into.logprobs.end(), more.logprobs.begin(), more.logprobs.end());
  for (auto& t : more.top_ids) into.top_ids.push_back(std::move(t));
  for (auto& t : more.top_logprobs) into.top_logprobs.push_back(std::move(t));
  into.finished = more.finished;
  into.reason = more.reason;
  into.error = std::move(more.error);
  if (more.cached_tokens >= 0) into.cached_tokens = more.cached_tokens;  // on one output only
  if (!more.handoff.empty()) into.handoff = std::move(more.handoff);     // on the last one
}

// A failpoint for the tests of engine failure (the C API's E_ENGINE_FAILED, the server's error
// path): DSV41RT_FAILPOINT_ENGINE_STEP=N makes the engine thread's N-th step throw, as a CUDA
// error or a bug would. Read once per Runtime; unset (the default): 0, never.
int64_t failpoint_engine_step() {
  const char* v = std::getenv("DSV41RT_FAILPOINT_ENGINE_STEP");
  return v ? std::strtoll(v, nullptr, 10) : 0;
}

}  // namespace

class Runtime::Impl {
  // A checked request on its way to the engine (the engine thread's inbox).
  struct Pending {
    int64_t id;
    std::vector<int32_t> prompt;
    engine::GenerationParams params;
    int32_t first_token = -1;  // a handoff (submit_handoff): the token generated there
    engine::Engine::CheckedHandoff handoff{};  // and the state after the prompt (checked once)
  };

 public:
  explicit Impl(RuntimeOptions options) : options_(std::move(options)) {
    LoadedModel m = load_model(options_);
    exec_ = m.executor;
    engine_ = std::make_unique<engine::Engine>(exec_, m.engine);
    // Direct sequences share the engine's pool: the prefix cache gives storage back to them.
    engine::Engine* en = engine_.get();
    sequences_ = std::make_unique<Sequences>(
        *exec_, Sequences::Reclaim{[en] { return en->evict_cached_page(); },
                                   [en] { return en->evict_cached_slot(); }});
    snapshot();
    if (options_.engine_thread) thread_ = std::thread([this] { run(); });
  }
  ~Impl() { shutdown(); }

  int64_t submit(std::vector<int32_t> prompt, const RequestParams& params, Callback cb) {
    engine::GenerationParams g = generation_params(params);
    if (!params.grammar.kind.empty()) g.grammar = compile_grammar(params.grammar);
    engine_->check(prompt, g);  // reads constants only: no wait for a running step
    return enqueue({0, std::move(prompt), std::move(g)}, std::move(cb));
  }

  // A checked request to the engine: through the inbox (engine thread) or at once.
  int64_t enqueue(Pending p, Callback cb) {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (failed_) DSV41RT_THROW_CODE(kEngineFailed, "engine failed: ", failure_);
      DSV41RT_CHECK_CODE(kEngineFailed, !stop_, "the runtime is shut down");
      p.id = next_id_++;
      deliveries_[p.id].callback = std::move(cb);
      if (options_.engine_thread) {
        const int64_t id = p.id;
        inbox_.push_back(std::move(p));
        work_.notify_one();
        return id;
      }
    }
    const int64_t id = p.id;
    try {  // no engine thread: the caller's next step() runs it
      std::lock_guard<std::mutex> e(engine_mu_);
      submit_to_engine(p);
    } catch (...) {
      std::lock_guard<std::mutex> l(mu_);
      deliveries_.erase(id);
      throw;
    }
    snapshot();
    return id;
  }

  int64_t submit_handoff(std::vector<int32_t> prompt, int32_t first_token,
                         std::vector<uint8_t> state, const RequestParams& params, Callback cb) {
    engine::GenerationParams g = generation_params(params);
    if (!params.grammar.kind.empty()) g.grammar = compile_grammar(params.grammar);
    // Reads constants only (no wait for a running step). The blob takes the caller's buffer
    // (moved, not copied) and reaches the engine as checked here.
    engine::Engine::CheckedHandoff checked = engine_->check_handoff(
        prompt, first_token, std::make_shared<const std::vector<uint8_t>>(std::move(state)), g);
    return enqueue({0, std::move(prompt), std::move(g), first_token, std::move(checked)},
                   std::move(cb));
  }

  std::optional<RequestOutput> await(int64_t id, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> l(mu_);
    auto it = deliveries_.find(id);
    DSV41RT_CHECK_CODE(kNotFound, it != deliveries_.end(), "unknown request id ", id);
    DSV41RT_CHECK(!it->second.callback, "request ", id, " delivers through its callback");
    const bool ready = out_.wait_for(l, timeout, [&] {
      auto i = deliveries_.find(id);
      return stop_ || i == deliveries_.end() || i->second.ready;
    });
    it = deliveries_.find(id);
    if (it == deliveries_.end()) DSV41RT_THROW_CODE(kNotFound, "unknown request id ", id);
    if (!ready || !it->second.ready) return std::nullopt;
    return take(it);
  }

  std::vector<RequestOutput> await_any(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> l(mu_);
    out_.wait_for(l, timeout, [&] { return stop_ || ready_count() > 0; });
    std::vector<RequestOutput> outs;
    for (auto it = deliveries_.begin(); it != deliveries_.end();) {
      auto next = std::next(it);
      if (!it->second.callback && it->second.ready) outs.push_back(take(it));
      it = next;
    }
    return outs;
  }

  void cancel(int64_t id, bool wait) {
    std::unique_lock<std::mutex> l(mu_);
    DSV41RT_CHECK_CODE(kNotFound, deliveries_.count(id), "unknown request id ", id);
    for (auto it = inbox_.begin(); it != inbox_.end(); ++it) {
      if (it->id != id) continue;  // not handed to the engine yet: ends here
      inbox_.erase(it);
      RequestOutput out;
      out.id = id, out.finished = true, out.reason = FinishReason::kAborted;
      deliver(l, {std::move(out)}, {}, 0);
      return;
    }
    if (!options_.engine_thread) {
      l.unlock();
      {
        std::lock_guard<std::mutex> e(engine_mu_);
        if (engine_->has_request(id)) engine_->cancel(id);  // aborted output: next step()
      }
      snapshot();
      return;
    }
    // The engine thread applies it between steps (pages freed at once) and delivers the end;
    // wait for that, so the caller sees the request finished when this returns (not from a
    // callback: that runs on the engine thread, which would wait for itself).
    cancels_.push_back(id);
    work_.notify_one();
    if (!wait || std::this_thread::get_id() == thread_.get_id()) return;
    out_.wait(l, [&] {  // a callback request: until its last callback returned
      auto it = deliveries_.find(id);
      return stop_ || failed_ || it == deliveries_.end() ||
             (it->second.ended && !it->second.callback);
    });
  }

  std::vector<RequestOutput> step() {
    DSV41RT_CHECK(!options_.engine_thread,
                  "step() drives a runtime created with engine_thread = false");
    const int64_t start = now_ns();
    std::vector<int64_t> scheduled;
    std::vector<RequestOutput> outs = run_step(&scheduled);
    snapshot();
    std::unique_lock<std::mutex> l(mu_);
    for (RequestOutput& o : outs) {
      auto it = deliveries_.find(o.id);
      if (it == deliveries_.end()) continue;
      if (it->second.first_scheduled_ns == 0) it->second.first_scheduled_ns = start;
      o.first_scheduled_ns = it->second.first_scheduled_ns;
    }
    std::vector<RequestOutput> copy = outs;
    deliver(l, std::move(outs), scheduled, start, /*keep=*/false);
    return copy;
  }

  bool idle() const {
    if (!options_.engine_thread) {
      std::lock_guard<std::mutex> e(engine_mu_);
      return engine_->idle();
    }
    std::lock_guard<std::mutex> l(mu_);
    return inbox_.empty() && cancels_.empty() && engine_idle_;
  }

  void shutdown() {
    std::vector<std::pair<Callback, RequestOutput>> calls;
    {
      std::lock_guard<std::mutex> l(mu_);
      if (stop_) return;
      stop_ = true;
      for (auto& [id, d] : deliveries_) {  // every consumer sees an end
        if (d.ended) continue;
        d.ended = d.ready = d.pending.finished = true;
        d.pending.id = id;
        if (d.pending.reason == FinishReason::kNone) d.pending.reason = FinishReason::kAborted;
        if (d.callback) calls.emplace_back(d.callback, d.pending);
      }
    }
    work_.notify_all();
    out_.notify_all();
    if (thread_.joinable()) thread_.join();
    for (auto& [cb, o] : calls) cb(o);  // after the engine thread's last callback
  }

  Stats stats() const {
    std::lock_guard<std::mutex> l(mu_);
    Stats s = stats_;
    s.scheduler.waiting += int64_t(inbox_.size());
    return s;
  }

  template <class Fn>
  auto with_engine(Fn fn) {
    std::lock_guard<std::mutex> e(engine_mu_);
    return fn(*engine_, *exec_, *sequences_);
  }
  void refresh() { snapshot(); }
  const RuntimeOptions& options() const { return options_; }

  void set_grammar_vocab(const std::vector<std::string>& tokens,
                         const std::vector<int32_t>& stops) {
    auto vocab = std::make_shared<const engine::GrammarVocab>(
        tokens, exec_->plan().config.vocab_size, stops);
    std::lock_guard<std::mutex> l(mu_);
    grammar_vocab_ = std::move(vocab);
  }

 private:
  void submit_to_engine(Pending& p) {  // engine_mu_ held
    if (!p.handoff.blob) {
      engine_->submit(std::move(p.prompt), p.params, p.id);
    } else {
      engine_->submit_handoff(std::move(p.prompt), p.first_token, std::move(p.handoff), p.params,
                              p.id);
    }
  }
  struct Delivery {
    Callback callback;
    RequestOutput pending;  // gathered since the consumer last took
    bool ready = false;     // something to take
    bool ended = false;     // the finished output was delivered
    int64_t first_scheduled_ns = 0;
  };

  int64_t ready_count() const {
    int64_t n = 0;
    for (const auto& [id, d] : deliveries_) n += !d.callback && d.ready;
    return n;
  }

  RequestOutput take(std::map<int64_t, Delivery>::iterator it) {
    RequestOutput out = std::move(it->second.pending);
    out.id = it->first;
    out.first_scheduled_ns = it->second.first_scheduled_ns;
    if (out.finished) {
      deliveries_.erase(it);
    } else {
      it->second.pending = {};
      it->second.ready = false;
    }
    return out;
  }

  // Hands one step's outputs to their consumers (callbacks are called after `l` is released);
  // keep = false (step() returns them itself): only callbacks and the bookkeeping.
  // `step_start`: when the step that ran `scheduled` began.
  void deliver(std::unique_lock<std::mutex>& l, std::vector<RequestOutput> outs,
               const std::vector<int64_t>& scheduled, int64_t step_start, bool keep = true) {
    for (int64_t id : scheduled) {
      auto it = deliveries_.find(id);
      if (it != deliveries_.end() && it->second.first_scheduled_ns == 0) {
        it->second.first_scheduled_ns = step_start;
      }
    }
    std::vector<std::pair<Callback, RequestOutput>> calls;
    std::vector<int64_t> called_last;  // callback requests that end with this delivery
    for (RequestOutput& o : outs) {
      auto it = deliveries_.find(o.id);
      if (it == deliveries_.end() || it->second.ended) continue;
      Delivery& d = it->second;
      o.first_scheduled_ns = d.first_scheduled_ns;
      const bool finished = o.finished;
      if (d.callback) {
        calls.emplace_back(d.callback, std::move(o));
        if (finished) called_last.push_back(it->first);
      } else if (keep) {
        gather(d.pending, std::move(o));
        d.ready = true;
      }
      if (finished) {
        d.ended = true;
        if (!d.callback && !keep) deliveries_.erase(it);
      }
    }
    l.unlock();
    for (auto& [cb, o] : calls) cb(o);
    l.lock();
    // Forgotten only after its last callback returned: cancel() waits for that.
    for (int64_t id : called_last) deliveries_.erase(id);
    out_.notify_all();
  }

  // One engine step with the inbox and the cancels applied first (under engine_mu_ only).

  // A request's grammar, compiled on the submitting thread (never the engine's).
  std::shared_ptr<engine::RequestGrammar> compile_grammar(const GrammarParams& g) {
    std::shared_ptr<const engine::GrammarVocab> vocab;
    {
      std::lock_guard<std::mutex> l(mu_);
      vocab = grammar_vocab_;
    }
    DSV41RT_CHECK_CODE(kInvalidArgument, engine::GrammarVocab::available(),
                       "grammar-constrained decoding is not in this build (configured without "
                       "xgrammar)");
    DSV41RT_CHECK_CODE(kInvalidArgument, vocab != nullptr,
                       "a grammar needs the tokenizer's vocabulary: call set_grammar_vocab first "
                       "(the Python Runtime gives it from the checkpoint's tokenizer.json)");
    return vocab->compile(g);
  }

  // Queued submits into the engine (engine_mu_ held); a refusal becomes the request's error
  // output at the next step.
  void submit_inbox(std::deque<Pending>& inbox) {
    for (Pending& p : inbox) {
      try {
        submit_to_engine(p);
      } catch (const std::exception& err) {  // checked at submit; state may have moved since
        RequestOutput out;
        out.id = p.id, out.finished = true, out.reason = FinishReason::kError,
        out.error = err.what();
        refused_.push_back(std::move(out));
      }
    }
  }

  std::vector<RequestOutput> run_step(std::vector<int64_t>* scheduled = nullptr) {
    std::deque<Pending> inbox;
    std::vector<int64_t> cancels;
    {
      std::lock_guard<std::mutex> l(mu_);
      inbox.swap(inbox_);
      cancels.swap(cancels_);
    }
    std::lock_guard<std::mutex> e(engine_mu_);
    submit_inbox(inbox);
    for (int64_t id : cancels) {
      if (engine_->has_request(id)) engine_->cancel(id);  // else it finished meanwhile
    }
    std::vector<RequestOutput> outs = std::move(refused_);
    refused_.clear();
    for (engine::RequestOutput& o : engine_->step(scheduled)) {
      RequestOutput r;
      r.id = o.id;
      r.tokens = std::move(o.new_tokens);
      r.logprobs = std::move(o.logprobs);
      r.top_ids = std::move(o.top_ids);
      r.top_logprobs = std::move(o.top_logprobs);
      r.finished = o.finished;
      r.reason = o.error.empty() ? reason_of(o.reason) : FinishReason::kError;
      r.error = std::move(o.error);
      r.cached_tokens = o.cached_tokens;
      r.handoff = std::move(o.handoff);
      outs.push_back(std::move(r));
    }
    return outs;
  }

  // Stats and idleness as of now (engine_mu_ must not be held by the caller).
  void snapshot() {
    std::lock_guard<std::mutex> e(engine_mu_);
    Stats s = to_stats(*engine_);
    std::lock_guard<std::mutex> l(mu_);
    stats_ = s;
    engine_idle_ = engine_->idle();
  }

  Stats to_stats(const engine::Engine& en) const;

  void run() {
    std::unique_lock<std::mutex> l(mu_);
    while (true) {
      work_.wait(l, [&] { return stop_ || !inbox_.empty() || !cancels_.empty() || !engine_idle_; });
      if (stop_) return;
      l.unlock();
      std::vector<int64_t> scheduled;
      std::vector<RequestOutput> outs;
      const int64_t start = now_ns();
      try {
        if (++steps_run_ == fail_at_step_) {
          DSV41RT_THROW_CODE(kInternal, "failpoint DSV41RT_FAILPOINT_ENGINE_STEP=", fail_at_step_);
        }
        outs = run_step(&scheduled);
        snapshot();
      } catch (const std::exception& err) {  // the engine cannot go on: end every request
        l.lock();
        failed_ = true;
        failure_ = err.what();
        std::vector<std::pair<Callback, RequestOutput>> calls;
        for (auto& [id, d] : deliveries_) {
          if (d.ended) continue;
          d.pending.id = id, d.pending.finished = d.ready = d.ended = true;
          d.pending.reason = FinishReason::kError;
          d.pending.error = "engine failed: " + failure_;
          if (d.callback) calls.emplace_back(d.callback, d.pending);
        }
        l.unlock();
        for (auto& [cb, o] : calls) cb(o);
        out_.notify_all();
        return;
      }
      l.lock();
      deliver(l, std::move(outs), scheduled, start);
    }
  }

  RuntimeOptions options_;
  std::vector<RequestOutput> refused_;  // under engine_mu_: submits the engine refused
  const int64_t fail_at_step_ = failpoint_engine_step();
  int64_t steps_run_ = 0;                                      // by the engine thread
  std::shared_ptr<const engine::GrammarVocab> grammar_vocab_;  // under mu_
  std::shared_ptr<model::Executor> exec_;
  std::unique_ptr<engine::Engine> engine_;
  std::unique_ptr<Sequences> sequences_;
  mutable std::mutex engine_mu_;
  mutable std::mutex mu_;
  std::condition_variable work_, out_;
  std::deque<Pending> inbox_;
  std::vector<int64_t> cancels_;
  std::map<int64_t, Delivery> deliveries_;
  int64_t next_id_ = 1;
  bool stop_ = false, failed_ = false, engine_idle_ = true;
  std::string failure_;
  Stats stats_;
  std::thread thread_;
};

Stats Runtime::Impl::to_stats(const engine::Engine& en) const {
  const engine::EngineStats e = en.stats();
  model::Executor& x = *exec_;
  Stats s;
  s.pool = {e.pool.pages_total,
            e.pool.pages_used,
            e.pool.slots_total,
            e.pool.slots_used,
            e.pool.bytes_total,
            x.pool().geometry().page_tokens,
            x.pool().geometry().page_bytes,
            x.pool().geometry().slot_bytes,
            x.memory_plan().workspace_bytes_per_page,
            x.memory_plan().scratch_bytes};
  const engine::SchedulerStats& q = e.scheduler;
  s.scheduler = {q.waiting,  q.running, q.preemptions,     q.admitted,
                 q.finished, q.aborted, q.max_waiting_seen};
  s.dequant = {e.dequant.dequant_calls, e.dequant.reuse_hits, e.dequant.rows_dequantised,
               e.dequant.reallocations};
  s.backend = x.backend_stats();
  s.steps = e.steps, s.tokens_computed = e.tokens_computed, s.tokens_generated = e.tokens_generated;
  // Pages and slots only the prefix cache holds are given back on demand: reported apart.
  s.pool.pages_cached = e.prefix_cache.reclaimable_pages;
  s.pool.slots_cached = e.prefix_cache.snapshots;
  s.pool.pages_used -= s.pool.pages_cached;
  s.pool.slots_used -= s.pool.slots_cached;
  const engine::PrefixCacheStats& c = e.prefix_cache;
  s.prefix_cache = {c.queries,           c.hits,           c.evicted_pages,
                    c.evicted_snapshots, c.host_pages,     c.host_bytes,
                    c.offloaded_pages,   c.restored_pages, c.offloaded_snapshots,
                    c.restored_snapshots};
  const engine::SpecDecodeStats& d = e.spec_decode;
  s.spec_decode = {d.drafts, d.draft_tokens, d.accepted_tokens, d.accepted_per_pos};
  return s;
}

// ---- the public class: forwards to Impl ------------------------------------------------------

Runtime::Runtime(RuntimeOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}
Runtime::~Runtime() = default;
Runtime::Runtime(Runtime&&) noexcept = default;
Runtime& Runtime::operator=(Runtime&&) noexcept = default;

int64_t Runtime::submit(std::vector<int32_t> prompt, const RequestParams& params, Callback cb) {
  return impl_->submit(std::move(prompt), params, std::move(cb));
}
int64_t Runtime::submit_handoff(std::vector<int32_t> prompt, int32_t first_token,
                                std::vector<uint8_t> state, const RequestParams& params,
                                Callback cb) {
  return impl_->submit_handoff(std::move(prompt), first_token, std::move(state), params,
                               std::move(cb));
}
std::optional<RequestOutput> Runtime::await(int64_t id, std::chrono::milliseconds timeout) {
  return impl_->await(id, timeout);
}
std::vector<RequestOutput> Runtime::await_any(std::chrono::milliseconds timeout) {
  return impl_->await_any(timeout);
}
void Runtime::cancel(int64_t id, bool wait) { impl_->cancel(id, wait); }
std::vector<RequestOutput> Runtime::step() { return impl_->step(); }
bool Runtime::idle() const { return impl_->idle(); }
void Runtime::shutdown() { impl_->shutdown(); }
Stats Runtime::stats() const { return impl_->stats(); }

int64_t Runtime::open_sequence() {
  const int64_t id = impl_->with_engine([](auto&, auto&, Sequences& s) { return s.open(); });
  impl_->refresh();  // it may have taken a slot back from the prefix cache
  return id;
}
void Runtime::forward(int64_t seq, const int32_t* tokens, int64_t n, bool all_logits, float* logits,
                      bool undoable) {
  impl_->with_engine(
      [&](auto&, auto&, Sequences& s) { s.forward(seq, tokens, n, all_logits, logits, undoable); });
  impl_->refresh();
}
void Runtime::rollback(int64_t seq, int64_t r) {
  impl_->with_engine([&](auto&, auto&, Sequences& s) { s.rollback(seq, r); });
  impl_->refresh();
}
std::vector<int32_t> Runtime::verify_greedy(int64_t seq, int32_t last_token,
                                            const std::vector<int32_t>& draft) {
  auto out = impl_->with_engine(
      [&](auto&, auto&, Sequences& s) { return s.verify_greedy(seq, last_token, draft); });
  impl_->refresh();
  return out;
}
DraftBlock Runtime::draft_greedy(int64_t seq, int32_t last_token) {
  return impl_->with_engine(
      [&](auto&, auto&, Sequences& s) { return s.draft_greedy(seq, last_token); });
}
int64_t Runtime::rollback_limit(int64_t seq) const {
  return impl_->with_engine([&](auto&, auto&, Sequences& s) { return s.rollback_limit(seq); });
}
int64_t Runtime::fork(int64_t seq) {
  const int64_t id = impl_->with_engine([&](auto&, auto&, Sequences& s) { return s.fork(seq); });
  impl_->refresh();
  return id;
}
void Runtime::decode(const std::vector<int64_t>& seqs, const int32_t* tokens, float* logits) {
  impl_->with_engine([&](auto&, auto&, Sequences& s) { s.decode(seqs, tokens, logits); });
  impl_->refresh();
}
void Runtime::decode_greedy(const std::vector<int64_t>& seqs, const int32_t* tokens, int32_t* next,
                            float* logprobs) {
  impl_->with_engine(
      [&](auto&, auto&, Sequences& s) { s.decode_greedy(seqs, tokens, next, logprobs); });
  impl_->refresh();
}
void Runtime::close_sequence(int64_t seq) {
  impl_->with_engine([&](auto&, auto&, Sequences& s) { s.close(seq); });
  impl_->refresh();
}
std::vector<uint8_t> Runtime::export_sequence(int64_t seq) {
  return impl_->with_engine([&](auto&, auto&, Sequences& s) { return s.export_state(seq); });
}
int64_t Runtime::import_sequence(const uint8_t* data, size_t size) {
  const int64_t id =
      impl_->with_engine([&](auto&, auto&, Sequences& s) { return s.import_state(data, size); });
  impl_->refresh();  // it may have taken a slot or pages back from the prefix cache
  return id;
}

ModelInfo Runtime::info() const {
  return impl_->with_engine([](auto&, model::Executor& x, auto&) {
    return ModelInfo{x.plan().config.vocab_size, int32_t(x.plan().config.eos_token_id), x.device()};
  });
}
Decisions Runtime::decisions() const {
  return impl_->with_engine([](auto&, model::Executor& x, auto&) { return x.decisions(); });
}
std::string Runtime::describe_pool() const {
  return impl_->with_engine([](auto&, model::Executor& x, auto&) {
    return x.pool().describe() + "\n" + x.memory_plan().describe();
  });
}
void Runtime::check_invariants() const {
  impl_->with_engine([](engine::Engine& en, auto&, Sequences& s) {
    std::vector<const std::vector<int32_t>*> tables;
    std::vector<int32_t> slots;
    s.owners(tables, slots);
    en.check_invariants(tables, slots);
  });
}
void Runtime::set_switch(Switch which, bool on) {
  impl_->with_engine([&](auto&, model::Executor& x, auto&) { x.set_switch(which, on); });
  impl_->refresh();
}
void Runtime::set_dequant_reuse(bool on) {
  impl_->with_engine([&](auto&, model::Executor& x, auto&) { x.workspaces().set_reuse(on); });
}
void Runtime::reset_dequant_counters() {
  impl_->with_engine([](auto&, model::Executor& x, auto&) { x.workspaces().reset_counters(); });
  impl_->refresh();
}
void Runtime::set_grammar_vocab(const std::vector<std::string>& tokens,
                                const std::vector<int32_t>& stop_token_ids) {
  impl_->set_grammar_vocab(tokens, stop_token_ids);
}

bool Runtime::grammar_available() { return engine::GrammarVocab::available(); }

void Runtime::reset_prefix_cache() {
  impl_->with_engine([](engine::Engine& en, auto&, auto&) { en.reset_prefix_cache(); });
  impl_->refresh();
}
void Runtime::run_cp_worker() {
  impl_->with_engine([](auto&, model::Executor& x, auto&) { x.run_cp_worker(); });
}

}  // namespace dsv41rt
