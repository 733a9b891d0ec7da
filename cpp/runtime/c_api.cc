// The C API (cpp/include/dsv41rt/dsv41rt.h) over the C++ facade (dsv41rt::Runtime): a handle owns
// a Runtime (and so its engine thread) plus what the C calling convention adds: partial takes of
// a request's tokens (a caller-sized buffer), thread-local error messages, and handles that
// survive misuse (NULL, destroyed, destroyed while other threads wait on them). Every entry point
// catches everything: no exception crosses the C boundary.
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/json.h"
#include "core/status.h"
#include "dsv41rt/dsv41rt.h"
#include "dsv41rt/runtime.hpp"

using dsv41rt::Error;
using dsv41rt::StatusCode;

struct dsv41rt_runtime {
  /// Tokens taken from the runtime but not yet by the caller (its buffer was smaller).
  struct Carry {
    std::vector<int32_t> tokens;
    bool finished = false;
    std::string error;  // set when the engine failed: given as E_ENGINE_FAILED after the tokens
  };
  std::unique_ptr<dsv41rt::Runtime> runtime;
  std::mutex mu;  // carries
  std::map<int64_t, Carry> carries;
  int64_t calls = 0;  // entry points running on this handle (guarded by g_live_mu)
};

namespace {

std::mutex g_live_mu;
std::condition_variable g_calls_left;
std::map<const dsv41rt_runtime*, bool> g_live;  // created and not yet destroyed
thread_local std::map<const dsv41rt_runtime*, std::string> t_errors;
thread_local const dsv41rt_runtime* t_in_callback = nullptr;

dsv41rt_status fail(const dsv41rt_runtime* rt, dsv41rt_status s, std::string message) {
  t_errors[rt] = std::move(message);
  return s;
}

dsv41rt_status from_code(StatusCode c) {
  switch (c) {
    case StatusCode::kOk:
      return DSV41RT_OK;
    case StatusCode::kInvalidArgument:
      return DSV41RT_E_INVALID_ARGUMENT;
    case StatusCode::kNotFound:
      return DSV41RT_E_NOT_FOUND;
    case StatusCode::kIoError:
      return DSV41RT_E_IO;
    case StatusCode::kOutOfRange:
      return DSV41RT_E_OUT_OF_RANGE;
    case StatusCode::kUnsupported:
      return DSV41RT_E_UNSUPPORTED;
    case StatusCode::kInternal:
      return DSV41RT_E_INTERNAL;
    case StatusCode::kEngineFailed:
      return DSV41RT_E_ENGINE_FAILED;
  }
  return DSV41RT_E_INTERNAL;
}

// Runs `body`, mapping exceptions to statuses and messages (for `rt`, or NULL while creating).
template <class Body>
dsv41rt_status catching(const dsv41rt_runtime* rt, Body&& body) {
  try {
    return body();
  } catch (const Error& e) {
    return fail(rt, from_code(e.kind()), e.message());
  } catch (const std::bad_alloc&) {
    return fail(rt, DSV41RT_E_OUT_OF_RANGE, "out of memory");
  } catch (const std::exception& e) {
    return fail(rt, DSV41RT_E_INTERNAL, e.what());
  } catch (...) {
    return fail(rt, DSV41RT_E_INTERNAL, "unknown exception");
  }
}

// Runs `body` on a live runtime; destroy() waits for it to leave before freeing the runtime.
template <class Body>
dsv41rt_status guarded(dsv41rt_runtime* rt, Body&& body) {
  {
    std::lock_guard<std::mutex> g(g_live_mu);
    if (rt == nullptr || !g_live.count(rt)) {
      return fail(
          nullptr, DSV41RT_E_INVALID_HANDLE,
          rt ? "runtime handle is destroyed or was never created" : "runtime handle is NULL");
    }
    ++rt->calls;
  }
  const dsv41rt_status s = catching(rt, body);
  std::lock_guard<std::mutex> g(g_live_mu);
  if (--rt->calls == 0) g_calls_left.notify_all();
  return s;
}

dsv41rt_status check_size(uint32_t got, size_t want, const char* what) {
  if (got == want) return DSV41RT_OK;
  return fail(nullptr, DSV41RT_E_ABI_MISMATCH,
              std::string(what) + ".struct_size is " + std::to_string(got) +
                  ", this library expects " + std::to_string(want) +
                  " (initialise it with the *_default_params function)");
}

// params.speculative_config, as dsv41rt.speculative.parse_speculative_config reads it, into the
// RuntimeOptions (count -1: self-tuned up to the drafter's block). Errors name what is wrong.
void read_speculative_config(const char* text, dsv41rt::RuntimeOptions& o) {
  dsv41rt::Json j;
  try {
    j = dsv41rt::json_parse(text);
  } catch (const dsv41rt::Error& e) {
    DSV41RT_THROW("params.speculative_config: not valid JSON (", e.what(), "): ", text);
  }
  DSV41RT_CHECK(j.is_object(), "params.speculative_config: must be a JSON object, got ", text);
  for (const auto& [key, value] : j.as_object()) {
    DSV41RT_CHECK(
        key == "method" || key == "num_speculative_tokens" || key == "disable_by_batch_size",
        "params.speculative_config: unknown key \"", key,
        "\" (known: method, num_speculative_tokens, disable_by_batch_size)");
  }
  const dsv41rt::Json* method = j.find("method");
  DSV41RT_CHECK(method && method->is_string() && method->as_string() == "dspark",
                "params.speculative_config: \"method\" must be \"dspark\" (V4.1's drafter)");
  const dsv41rt::Json* k = j.find("num_speculative_tokens");
  o.num_speculative_tokens = -1;
  if (k && !k->is_null()) {
    DSV41RT_CHECK(k->is_int() && k->as_int() >= 0,
                  "params.speculative_config: \"num_speculative_tokens\" must be an integer >= 0");
    o.num_speculative_tokens = k->as_int();
  }
  const dsv41rt::Json* b = j.find("disable_by_batch_size");
  if (b && !b->is_null()) {
    DSV41RT_CHECK(b->is_int() && b->as_int() >= 1,
                  "params.speculative_config: \"disable_by_batch_size\" must be an integer >= 1");
    o.speculative_disable_by_batch_size = b->as_int();
  }
}

dsv41rt::RuntimeOptions options_from(const dsv41rt_runtime_params& p) {
  dsv41rt::RuntimeOptions o;
  o.checkpoint = p.checkpoint_dir;
  if (p.engram_tables) o.engram_tables = p.engram_tables;
  o.device.device = p.device ? p.device : "cpu";
  o.device.enforce_eager = p.enforce_eager != 0;
  DSV41RT_CHECK(p.precision == DSV41RT_PRECISION_FP32 || p.precision == DSV41RT_PRECISION_BF16 ||
                    p.precision == DSV41RT_PRECISION_FP8,
                "params.precision: unknown value ", p.precision);
  o.numerics.precision = p.precision == DSV41RT_PRECISION_BF16  ? dsv41rt::Precision::kBf16
                         : p.precision == DSV41RT_PRECISION_FP8 ? dsv41rt::Precision::kFp8
                                                                : dsv41rt::Precision::kFp32;
  DSV41RT_CHECK(
      p.kv_cache_dtype == DSV41RT_KV_CACHE_AUTO || p.kv_cache_dtype == DSV41RT_KV_CACHE_FLOAT32,
      "params.kv_cache_dtype: unknown value ", p.kv_cache_dtype);
  o.numerics.kv_cache_dtype = p.kv_cache_dtype == DSV41RT_KV_CACHE_FLOAT32
                                  ? dsv41rt::KvCacheDtype::kFloat32
                                  : dsv41rt::KvCacheDtype::kAuto;
  o.pool.kv_memory = p.kv_memory;
  o.pool.max_num_seqs = p.max_num_seqs;
  o.pool.max_num_batched_tokens = p.max_num_batched_tokens;
  o.pool.max_model_len = p.max_model_len;
  o.pool.page_size = p.page_size;
  o.pool.max_prefill_tokens_while_decoding = p.max_prefill_tokens_while_decoding;
  o.pool.max_decode_slowdown = p.max_decode_slowdown;
  o.pool.enable_prefix_caching = p.enable_prefix_caching != 0;
  o.pool.host_cache_memory = p.host_cache_memory;
  o.parallel.tensor_parallel_size = p.tensor_parallel_size;
  o.parallel.expert_parallel_size = p.expert_parallel_size;
  if (p.speculative_config && *p.speculative_config) {
    read_speculative_config(p.speculative_config, o);
  }
  return o;
}

dsv41rt::RequestParams request_from(const dsv41rt_request_params& p) {
  dsv41rt::RequestParams r;
  r.max_new_tokens = p.max_new_tokens;
  const dsv41rt_sampling_params& s = p.sampling;
  r.sampling.temperature = s.temperature;
  r.sampling.top_k = s.top_k;
  r.sampling.top_p = s.top_p;
  r.sampling.min_p = s.min_p;
  r.sampling.presence_penalty = s.presence_penalty;
  r.sampling.frequency_penalty = s.frequency_penalty;
  r.sampling.repetition_penalty = s.repetition_penalty;
  r.sampling.seed = s.seed;
  r.stop_token_ids.assign(p.stop_token_ids, p.stop_token_ids + p.n_stop_token_ids);
  r.ignore_eos = p.ignore_eos != 0;
  if (p.struct_size == sizeof(p) && p.grammar_kind) {  // older layouts have no grammar
    r.grammar.kind = p.grammar_kind;
    r.grammar.text = p.grammar_text ? p.grammar_text : "";
    r.grammar.start_token = p.grammar_start_token;
    r.grammar.start_within = p.grammar_start_within;
  }
  return r;
}

// Moves up to `capacity` carried tokens of `id` out; finished once the request ended and every
// token was taken (the id is then forgotten). A request the engine's failure ended gives its
// tokens first, then E_ENGINE_FAILED with the failure (finished = 1).
dsv41rt_status take(dsv41rt_runtime* rt, int64_t id, int32_t* tokens, size_t capacity,
                    size_t* n_out, int* finished) {
  dsv41rt_runtime::Carry& c = rt->carries[id];
  if (c.tokens.empty() && !c.error.empty()) {
    std::string error = std::move(c.error);
    rt->carries.erase(id);
    *n_out = 0, *finished = 1;
    return fail(rt, DSV41RT_E_ENGINE_FAILED, "request " + std::to_string(id) + ": " + error);
  }
  const size_t n = std::min(capacity, c.tokens.size());
  std::copy(c.tokens.begin(), c.tokens.begin() + n, tokens);
  c.tokens.erase(c.tokens.begin(), c.tokens.begin() + n);
  *n_out = n;
  *finished = c.finished && c.tokens.empty() && c.error.empty() ? 1 : 0;
  if (*finished) rt->carries.erase(id);
  return DSV41RT_OK;
}

// poll (timeout 0) and wait: the carry first, else what the runtime gathered (waiting up to
// `timeout_ms`, < 0: forever).
dsv41rt_status poll_or_wait(dsv41rt_runtime* rt, int64_t id, int32_t timeout_ms, int32_t* tokens,
                            size_t capacity, size_t* n_out, int* finished) {
  if (!n_out || !finished || (!tokens && capacity)) {
    return fail(rt, DSV41RT_E_INVALID_ARGUMENT,
                "n_out and finished are required (tokens when capacity > 0)");
  }
  {
    std::lock_guard<std::mutex> l(rt->mu);
    auto it = rt->carries.find(id);
    if (it != rt->carries.end() && (!it->second.tokens.empty() || it->second.finished)) {
      return take(rt, id, tokens, capacity, n_out, finished);
    }
  }
  std::optional<dsv41rt::RequestOutput> out;
  if (timeout_ms >= 0) {
    out = rt->runtime->await(id, std::chrono::milliseconds(timeout_ms));
  } else {
    while (!out) out = rt->runtime->await(id, std::chrono::hours(1));
  }
  if (!out) {
    if (timeout_ms == 0) {  // poll: nothing yet is not an error
      *n_out = 0, *finished = 0;
      return DSV41RT_OK;
    }
    return fail(rt, DSV41RT_E_TIMEOUT, "nothing new for request " + std::to_string(id));
  }
  std::lock_guard<std::mutex> l(rt->mu);
  dsv41rt_runtime::Carry& c = rt->carries[id];
  c.tokens.insert(c.tokens.end(), out->tokens.begin(), out->tokens.end());
  c.finished = out->finished;
  if (out->reason == dsv41rt::FinishReason::kError) c.error = out->error;
  return take(rt, id, tokens, capacity, n_out, finished);
}

}  // namespace

extern "C" {

uint32_t dsv41rt_abi_version(void) { return DSV41RT_ABI_VERSION; }
const char* dsv41rt_version(void) { return "0.1.0"; }

const char* dsv41rt_status_name(dsv41rt_status s) {
  switch (s) {
    case DSV41RT_OK:
      return "ok";
    case DSV41RT_E_INVALID_ARGUMENT:
      return "invalid_argument";
    case DSV41RT_E_NOT_FOUND:
      return "not_found";
    case DSV41RT_E_IO:
      return "io_error";
    case DSV41RT_E_OUT_OF_RANGE:
      return "out_of_range";
    case DSV41RT_E_UNSUPPORTED:
      return "unsupported";
    case DSV41RT_E_INTERNAL:
      return "internal";
    case DSV41RT_E_ABI_MISMATCH:
      return "abi_mismatch";
    case DSV41RT_E_INVALID_HANDLE:
      return "invalid_handle";
    case DSV41RT_E_TIMEOUT:
      return "timeout";
    case DSV41RT_E_ENGINE_FAILED:
      return "engine_failed";
  }
  return "unknown_status";
}

const char* dsv41rt_last_error(const dsv41rt_runtime* rt) {
  auto it = t_errors.find(rt);
  return it == t_errors.end() ? "" : it->second.c_str();
}

// The defaults are the C++ facade's (RuntimeOptions{}): one default per option.
void dsv41rt_runtime_default_params(dsv41rt_runtime_params* p) {
  if (!p) return;
  const dsv41rt::RuntimeOptions d;
  *p = {};
  p->struct_size = sizeof(*p);
  p->device = "cpu";
  p->precision = DSV41RT_PRECISION_FP32;
  p->kv_cache_dtype = DSV41RT_KV_CACHE_AUTO;
  p->kv_memory = d.pool.kv_memory;
  p->max_num_seqs = d.pool.max_num_seqs;
  p->max_num_batched_tokens = d.pool.max_num_batched_tokens;
  p->max_model_len = d.pool.max_model_len;
  p->page_size = d.pool.page_size;
  p->enforce_eager = d.device.enforce_eager ? 1 : 0;
  p->max_prefill_tokens_while_decoding = d.pool.max_prefill_tokens_while_decoding;
  p->max_decode_slowdown = d.pool.max_decode_slowdown;
  p->enable_prefix_caching = d.pool.enable_prefix_caching ? 1 : 0;
  p->host_cache_memory = d.pool.host_cache_memory;
  p->tensor_parallel_size = d.parallel.tensor_parallel_size;
  p->expert_parallel_size = d.parallel.expert_parallel_size;
}

void dsv41rt_sampling_default_params(dsv41rt_sampling_params* p) {
  if (!p) return;
  const dsv41rt::SamplingParams d;
  *p = {};
  p->struct_size = sizeof(*p);
  p->temperature = d.temperature;
  p->top_k = d.top_k;
  p->top_p = d.top_p;
  p->min_p = d.min_p;
  p->presence_penalty = d.presence_penalty;
  p->frequency_penalty = d.frequency_penalty;
  p->repetition_penalty = d.repetition_penalty;
  p->seed = d.seed;
}

void dsv41rt_request_default_params(dsv41rt_request_params* p) {
  if (!p) return;
  *p = {};
  p->struct_size = sizeof(*p);
  p->max_new_tokens = dsv41rt::RequestParams{}.max_new_tokens;
  dsv41rt_sampling_default_params(&p->sampling);
  p->grammar_start_token = -1;
  p->grammar_start_within = -1;
}

void dsv41rt_stats_init(dsv41rt_stats* s) {
  if (!s) return;
  *s = {};
  s->struct_size = sizeof(*s);
}

dsv41rt_status dsv41rt_runtime_create(uint32_t abi_version, const dsv41rt_runtime_params* params,
                                      dsv41rt_runtime** out) {
  if (!out) return fail(nullptr, DSV41RT_E_INVALID_ARGUMENT, "out is NULL");
  *out = nullptr;
  if (abi_version != DSV41RT_ABI_VERSION) {
    return fail(nullptr, DSV41RT_E_ABI_MISMATCH,
                "the caller was built for ABI version " + std::to_string(abi_version) +
                    ", this library is version " + std::to_string(DSV41RT_ABI_VERSION));
  }
  if (!params) return fail(nullptr, DSV41RT_E_INVALID_ARGUMENT, "params is NULL");
  // Older layouts end before a field added since (0.1.0 before max_prefill_tokens_while_decoding,
  // the next before enable_prefix_caching, the next before host_cache_memory, the next before
  // tensor_parallel_size, the next before speculative_config, the next before max_decode_slowdown):
  // read only the bytes the caller has, the rest keeps this library's defaults.
  constexpr size_t kSize010 = offsetof(dsv41rt_runtime_params, max_prefill_tokens_while_decoding);
  constexpr size_t kSizePrefill = offsetof(dsv41rt_runtime_params, enable_prefix_caching);
  constexpr size_t kSizePrefixCaching = offsetof(dsv41rt_runtime_params, host_cache_memory);
  constexpr size_t kSizeHostCache = offsetof(dsv41rt_runtime_params, tensor_parallel_size);
  constexpr size_t kSizeParallel = offsetof(dsv41rt_runtime_params, speculative_config);
  constexpr size_t kSizeSpeculative = offsetof(dsv41rt_runtime_params, max_decode_slowdown);
  dsv41rt_runtime_params p;
  dsv41rt_runtime_default_params(&p);
  if (params->struct_size == kSize010 || params->struct_size == kSizePrefill ||
      params->struct_size == kSizePrefixCaching || params->struct_size == kSizeHostCache ||
      params->struct_size == kSizeParallel || params->struct_size == kSizeSpeculative) {
    std::memcpy(&p, params, params->struct_size);
    p.struct_size = sizeof(p);
  } else if (dsv41rt_status s =
                 check_size(params->struct_size, sizeof(*params), "dsv41rt_runtime_params")) {
    return s;
  } else {
    p = *params;
  }
  if (!p.checkpoint_dir || !*p.checkpoint_dir) {
    return fail(nullptr, DSV41RT_E_INVALID_ARGUMENT, "params.checkpoint_dir is NULL or empty");
  }
  return catching(nullptr, [&]() -> dsv41rt_status {
    auto rt = std::make_unique<dsv41rt_runtime>();
    rt->runtime = std::make_unique<dsv41rt::Runtime>(options_from(p));
    std::lock_guard<std::mutex> g(g_live_mu);
    g_live[rt.get()] = true;
    *out = rt.release();
    return DSV41RT_OK;
  });
}

dsv41rt_status dsv41rt_runtime_destroy(dsv41rt_runtime* rt) {
  if (!rt) return DSV41RT_OK;
  if (t_in_callback == rt) {
    return fail(rt, DSV41RT_E_INVALID_ARGUMENT,
                "dsv41rt_runtime_destroy called from a token callback of the same runtime");
  }
  {
    std::lock_guard<std::mutex> g(g_live_mu);
    if (!g_live.erase(rt)) {
      return fail(nullptr, DSV41RT_E_INVALID_HANDLE,
                  "runtime handle is destroyed or was never created");
    }
  }
  rt->runtime->shutdown();  // ends every request: waiting calls return
  {
    std::unique_lock<std::mutex> g(g_live_mu);
    g_calls_left.wait(g, [&] { return rt->calls == 0; });
  }
  t_errors.erase(rt);
  delete rt;
  return DSV41RT_OK;
}

dsv41rt_status dsv41rt_submit(dsv41rt_runtime* rt, const int32_t* tokens, size_t n_tokens,
                              const dsv41rt_request_params* params, int64_t* out_id) {
  return guarded(rt, [&]() -> dsv41rt_status {
    if (!tokens || n_tokens == 0 || !out_id || !params) {
      return fail(rt, DSV41RT_E_INVALID_ARGUMENT,
                  "tokens, n_tokens > 0, params and out_id are required");
    }
    // The 0.1.0 layout ended before the grammar fields.
    constexpr size_t kSize010 = offsetof(dsv41rt_request_params, grammar_kind);
    if ((params->struct_size != sizeof(*params) && params->struct_size != kSize010) ||
        params->sampling.struct_size != sizeof(params->sampling)) {
      return fail(
          rt, DSV41RT_E_ABI_MISMATCH,
          "dsv41rt_request_params.struct_size (or its sampling.struct_size) is not this library's; "
          "initialise it with dsv41rt_request_default_params");
    }
    if (params->n_stop_token_ids && !params->stop_token_ids) {
      return fail(rt, DSV41RT_E_INVALID_ARGUMENT,
                  "stop_token_ids is NULL but n_stop_token_ids > 0");
    }
    dsv41rt::Runtime::Callback on_output;
    if (params->callback) {
      on_output = [rt, cb = params->callback,
                   ud = params->user_data](const dsv41rt::RequestOutput& o) {
        t_in_callback = rt;
        cb(o.id, o.tokens.data(), o.tokens.size(), o.finished ? 1 : 0, ud);
        t_in_callback = nullptr;
      };
    }
    *out_id = rt->runtime->submit(std::vector<int32_t>(tokens, tokens + n_tokens),
                                  request_from(*params), std::move(on_output));
    return DSV41RT_OK;
  });
}

dsv41rt_status dsv41rt_poll(dsv41rt_runtime* rt, int64_t id, int32_t* tokens, size_t capacity,
                            size_t* n_out, int* finished) {
  return guarded(rt, [&] { return poll_or_wait(rt, id, 0, tokens, capacity, n_out, finished); });
}

dsv41rt_status dsv41rt_wait(dsv41rt_runtime* rt, int64_t id, int32_t timeout_ms, int32_t* tokens,
                            size_t capacity, size_t* n_out, int* finished) {
  return guarded(
      rt, [&] { return poll_or_wait(rt, id, timeout_ms, tokens, capacity, n_out, finished); });
}

dsv41rt_status dsv41rt_cancel(dsv41rt_runtime* rt, int64_t id) {
  return guarded(rt, [&]() -> dsv41rt_status {
    {
      std::lock_guard<std::mutex> l(rt->mu);
      auto it = rt->carries.find(id);
      if (it != rt->carries.end() && it->second.finished) return DSV41RT_OK;  // ended already
    }
    rt->runtime->cancel(id);
    return DSV41RT_OK;
  });
}

dsv41rt_status dsv41rt_reset_prefix_cache(dsv41rt_runtime* rt) {
  return guarded(rt, [&]() -> dsv41rt_status {
    rt->runtime->reset_prefix_cache();
    return DSV41RT_OK;
  });
}

dsv41rt_status dsv41rt_set_grammar_vocab(dsv41rt_runtime* rt, const char* const* tokens,
                                         const size_t* lengths, size_t n_tokens,
                                         const int32_t* stop_token_ids, size_t n_stop_token_ids) {
  return guarded(rt, [&]() -> dsv41rt_status {
    if ((n_tokens && (!tokens || !lengths)) || (n_stop_token_ids && !stop_token_ids)) {
      return fail(rt, DSV41RT_E_INVALID_ARGUMENT,
                  "tokens and lengths (n_tokens > 0) or stop_token_ids (n > 0) is NULL");
    }
    std::vector<std::string> t;
    t.reserve(n_tokens);
    for (size_t i = 0; i < n_tokens; ++i) {
      if (lengths[i] && !tokens[i]) {
        return fail(rt, DSV41RT_E_INVALID_ARGUMENT,
                    "tokens[" + std::to_string(i) + "] is NULL with a nonzero length");
      }
      t.emplace_back(lengths[i] ? tokens[i] : "", lengths[i]);
    }
    rt->runtime->set_grammar_vocab(
        t, std::vector<int32_t>(stop_token_ids, stop_token_ids + n_stop_token_ids));
    return DSV41RT_OK;
  });
}

dsv41rt_status dsv41rt_get_stats(dsv41rt_runtime* rt, dsv41rt_stats* out) {
  return guarded(rt, [&]() -> dsv41rt_status {
    if (!out) return fail(rt, DSV41RT_E_INVALID_ARGUMENT, "out is NULL");
    // The 0.1.0 layout ended before the prefix cache counters, the next before the host tier's,
    // the next before the spec-decode counters:
    // what a layout does not have is not written.
    constexpr size_t kSize010 = offsetof(dsv41rt_stats, prefix_cache_queries);
    constexpr size_t kSizePrefix = offsetof(dsv41rt_stats, prefix_cache_host_bytes);
    constexpr size_t kSizeHost = offsetof(dsv41rt_stats, spec_decode_num_drafts);
    if (out->struct_size != sizeof(*out) && out->struct_size != kSize010 &&
        out->struct_size != kSizePrefix && out->struct_size != kSizeHost) {
      return fail(rt, DSV41RT_E_ABI_MISMATCH,
                  "dsv41rt_stats.struct_size is not this library's (dsv41rt_stats_init)");
    }
    const dsv41rt::Stats s = rt->runtime->stats();
    out->requests_running = s.scheduler.running;
    out->requests_waiting = s.scheduler.waiting;
    out->requests_finished = s.scheduler.finished + s.scheduler.aborted;
    out->preemptions = s.scheduler.preemptions;
    out->pages_total = s.pool.pages_total;
    out->pages_used = s.pool.pages_used;
    out->page_size = s.pool.page_size;
    out->tokens_generated = s.tokens_generated;
    out->steps = s.steps;
    if (out->struct_size >= kSizePrefix) {
      out->prefix_cache_queries = s.prefix_cache.queries;
      out->prefix_cache_hits = s.prefix_cache.hits;
    }
    if (out->struct_size >= kSizeHost) {
      out->prefix_cache_host_bytes = s.prefix_cache.host_bytes;
      out->prefix_cache_host_offloaded_pages = s.prefix_cache.offloaded_pages;
      out->prefix_cache_host_restored_pages = s.prefix_cache.restored_pages;
    }
    if (out->struct_size == sizeof(*out)) {
      out->spec_decode_num_drafts = s.spec_decode.drafts;
      out->spec_decode_num_draft_tokens = s.spec_decode.draft_tokens;
      out->spec_decode_num_accepted_tokens = s.spec_decode.accepted_tokens;
    }
    return DSV41RT_OK;
  });
}

}  // extern "C"
