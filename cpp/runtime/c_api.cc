// The C API (cpp/include/dsv41rt/dsv41rt.h) over engine::Engine: a runtime owns the engine and an
// engine thread that steps it while any request is unfinished; API calls take the runtime's mutex
// (the engine is not thread-safe), outputs go to per-request buffers or callbacks. Every entry
// point catches everything: no exception crosses the C boundary.
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/safetensors.h"
#include "core/status.h"
#include "dsv41rt/dsv41rt.h"
#include "runtime/engine/engine.h"
#include "runtime/model/engram_tables.h"
#include "runtime/model/executor.h"
#include "runtime/model/layer_plan.h"
#include "runtime/model/model_config.h"
#include "runtime/model/weights.h"

using dsv41rt::Error;
using dsv41rt::StatusCode;

struct dsv41rt_runtime {
  struct Request {
    std::vector<int32_t> pending;  // generated, not yet taken by poll/wait
    bool finished = false;
    dsv41rt_token_callback callback = nullptr;
    void* user_data = nullptr;
  };

  std::unique_ptr<dsv41rt::engine::Engine> engine;
  std::mutex mu;                 // engine, requests, flags
  std::condition_variable work;  // engine thread: something to do
  std::condition_variable out;   // consumers: new tokens or a finish
  std::map<int64_t, Request> requests;
  bool stop = false;
  bool failed = false;
  std::string failure;
  int64_t finished_total = 0;
  std::thread thread;

  void run();
};

namespace {

std::mutex g_live_mu;
std::set<const dsv41rt_runtime*> g_live;  // created and not yet destroyed
thread_local std::map<const dsv41rt_runtime*, std::string> t_errors;

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
  }
  return DSV41RT_E_INTERNAL;
}

bool live(const dsv41rt_runtime* rt) {
  std::lock_guard<std::mutex> g(g_live_mu);
  return rt != nullptr && g_live.count(rt) != 0;
}

// Runs `body` for a live runtime, mapping exceptions to statuses and messages.
template <class Body>
dsv41rt_status guarded(dsv41rt_runtime* rt, Body&& body) {
  if (!live(rt)) {
    return fail(nullptr, DSV41RT_E_INVALID_HANDLE,
                rt ? "runtime handle is destroyed or was never created" : "runtime handle is NULL");
  }
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

dsv41rt_status check_size(uint32_t got, size_t want, const char* what) {
  if (got == want) return DSV41RT_OK;
  return fail(nullptr, DSV41RT_E_ABI_MISMATCH,
              std::string(what) + ".struct_size is " + std::to_string(got) +
                  ", this library expects " + std::to_string(want) +
                  " (initialise it with the *_default_params function)");
}

// Takes up to `capacity` pending tokens; reports finished (and forgets the id) once drained.
dsv41rt_status take(dsv41rt_runtime* rt, dsv41rt_runtime::Request& r, int64_t id, int32_t* tokens,
                    size_t capacity, size_t* n_out, int* finished) {
  const size_t n = std::min(capacity, r.pending.size());
  std::copy(r.pending.begin(), r.pending.begin() + n, tokens);
  r.pending.erase(r.pending.begin(), r.pending.begin() + n);
  *n_out = n;
  *finished = r.finished && r.pending.empty() ? 1 : 0;
  if (*finished) rt->requests.erase(id);
  return DSV41RT_OK;
}

}  // namespace

void dsv41rt_runtime::run() {
  std::unique_lock<std::mutex> lock(mu);
  while (true) {
    work.wait(lock, [&] { return stop || !engine->idle(); });
    if (stop) return;
    struct Call {
      dsv41rt_token_callback fn;
      int64_t id;
      std::vector<int32_t> tokens;
      bool finished;
      void* user_data;
    };
    std::vector<Call> calls;
    try {
      for (dsv41rt::engine::RequestOutput& o : engine->step()) {
        auto it = requests.find(o.id);
        if (it == requests.end()) continue;
        Request& r = it->second;
        if (o.finished) {
          r.finished = true;
          ++finished_total;
        }
        if (r.callback) {
          calls.push_back({r.callback, o.id, std::move(o.new_tokens), o.finished, r.user_data});
          if (o.finished) requests.erase(it);
        } else {
          r.pending.insert(r.pending.end(), o.new_tokens.begin(), o.new_tokens.end());
        }
      }
    } catch (const std::exception& e) {  // the engine cannot continue: fail every request
      failed = true;
      failure = e.what();
      for (auto& [id, r] : requests) r.finished = true;
      out.notify_all();
      return;
    }
    lock.unlock();
    for (Call& c : calls)
      c.fn(c.id, c.tokens.data(), c.tokens.size(), c.finished ? 1 : 0, c.user_data);
    out.notify_all();
    lock.lock();
  }
}

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

void dsv41rt_runtime_default_params(dsv41rt_runtime_params* p) {
  if (!p) return;
  *p = {};
  p->struct_size = sizeof(*p);
  p->device = "cpu";
  p->kv_memory_bytes = int64_t(256) << 20;
  p->max_running = 16;
  p->token_budget = 512;
}

void dsv41rt_sampling_default_params(dsv41rt_sampling_params* p) {
  if (!p) return;
  *p = {};
  p->struct_size = sizeof(*p);
  p->temperature = 0.0f;
  p->top_p = 1.0f;
  p->repetition_penalty = 1.0f;
}

void dsv41rt_request_default_params(dsv41rt_request_params* p) {
  if (!p) return;
  *p = {};
  p->struct_size = sizeof(*p);
  p->max_new_tokens = 16;
  dsv41rt_sampling_default_params(&p->sampling);
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
  if (dsv41rt_status s =
          check_size(params->struct_size, sizeof(*params), "dsv41rt_runtime_params")) {
    return s;
  }
  if (!params->checkpoint_dir || !*params->checkpoint_dir) {
    return fail(nullptr, DSV41RT_E_INVALID_ARGUMENT, "params.checkpoint_dir is NULL or empty");
  }
  if (params->kv_memory_bytes <= 0 || params->max_running < 1 || params->token_budget < 1 ||
      params->max_context < 0) {
    return fail(
        nullptr, DSV41RT_E_INVALID_ARGUMENT,
        "params: kv_memory_bytes, max_running and token_budget must be positive, max_context "
        ">= 0");
  }
  try {
    namespace m = dsv41rt::model;
    const std::string dir = params->checkpoint_dir;
    const std::string device = params->device ? params->device : "cpu";
    dsv41rt::ModelPlan plan = dsv41rt::build_model_plan(dsv41rt::load_model_config(dir));
    auto ck = std::make_shared<dsv41rt::Checkpoint>(dir);
    m::EngramTables tables = m::load_engram_tables(dir, plan.config);
    m::ModelWeights weights = m::load_weights(ck, plan, /*host_values=*/device == "cpu");
    m::ExecutorOptions options;
    options.kv_memory_bytes = params->kv_memory_bytes;
    options.max_requests = params->max_running;
    options.token_budget = params->token_budget;
    options.max_context = params->max_context;
    options.device = device;
    auto exec = m::make_executor(std::move(plan), std::move(weights), std::move(tables), options);
    auto rt = std::make_unique<dsv41rt_runtime>();
    rt->engine = std::make_unique<dsv41rt::engine::Engine>(
        exec, dsv41rt::engine::EngineConfig{params->max_running, params->token_budget,
                                            params->max_context});
    rt->thread = std::thread([r = rt.get()] { r->run(); });
    {
      std::lock_guard<std::mutex> g(g_live_mu);
      g_live.insert(rt.get());
    }
    *out = rt.release();
    return DSV41RT_OK;
  } catch (const Error& e) {
    return fail(nullptr, from_code(e.kind()), e.message());
  } catch (const std::bad_alloc&) {
    return fail(nullptr, DSV41RT_E_OUT_OF_RANGE, "out of memory while loading the model");
  } catch (const std::exception& e) {
    return fail(nullptr, DSV41RT_E_INTERNAL, e.what());
  }
}

dsv41rt_status dsv41rt_runtime_destroy(dsv41rt_runtime* rt) {
  if (!rt) return DSV41RT_OK;
  {
    std::lock_guard<std::mutex> g(g_live_mu);
    if (!g_live.erase(rt)) {
      return fail(nullptr, DSV41RT_E_INVALID_HANDLE,
                  "runtime handle is destroyed or was never created");
    }
  }
  {
    std::lock_guard<std::mutex> g(rt->mu);
    rt->stop = true;
  }
  rt->work.notify_all();
  rt->out.notify_all();
  if (rt->thread.joinable()) rt->thread.join();
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
    if (params->struct_size != sizeof(*params) ||
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
    dsv41rt::engine::GenerationParams g;
    g.max_new_tokens = params->max_new_tokens;
    const dsv41rt_sampling_params& s = params->sampling;
    g.sampling.temperature = s.temperature;
    g.sampling.top_k = s.top_k;
    g.sampling.top_p = s.top_p;
    g.sampling.min_p = s.min_p;
    g.sampling.presence_penalty = s.presence_penalty;
    g.sampling.frequency_penalty = s.frequency_penalty;
    g.sampling.repetition_penalty = s.repetition_penalty;
    g.sampling.seed = s.seed;
    g.stop_token_ids.assign(params->stop_token_ids,
                            params->stop_token_ids + params->n_stop_token_ids);
    g.ignore_eos = params->ignore_eos != 0;
    std::lock_guard<std::mutex> lock(rt->mu);
    if (rt->failed) return fail(rt, DSV41RT_E_ENGINE_FAILED, "engine failed: " + rt->failure);
    const int64_t id = rt->engine->submit(std::vector<int32_t>(tokens, tokens + n_tokens), g);
    dsv41rt_runtime::Request& r = rt->requests[id];
    r.callback = params->callback;
    r.user_data = params->user_data;
    *out_id = id;
    rt->work.notify_one();
    return DSV41RT_OK;
  });
}

dsv41rt_status dsv41rt_poll(dsv41rt_runtime* rt, int64_t id, int32_t* tokens, size_t capacity,
                            size_t* n_out, int* finished) {
  return guarded(rt, [&]() -> dsv41rt_status {
    if (!n_out || !finished || (!tokens && capacity)) {
      return fail(rt, DSV41RT_E_INVALID_ARGUMENT,
                  "n_out and finished are required (tokens when capacity > 0)");
    }
    std::lock_guard<std::mutex> lock(rt->mu);
    auto it = rt->requests.find(id);
    if (it == rt->requests.end())
      return fail(rt, DSV41RT_E_NOT_FOUND, "unknown request id " + std::to_string(id));
    if (it->second.callback) {
      return fail(rt, DSV41RT_E_INVALID_ARGUMENT,
                  "request " + std::to_string(id) + " delivers through its callback");
    }
    return take(rt, it->second, id, tokens, capacity, n_out, finished);
  });
}

dsv41rt_status dsv41rt_wait(dsv41rt_runtime* rt, int64_t id, int32_t timeout_ms, int32_t* tokens,
                            size_t capacity, size_t* n_out, int* finished) {
  return guarded(rt, [&]() -> dsv41rt_status {
    if (!n_out || !finished || (!tokens && capacity)) {
      return fail(rt, DSV41RT_E_INVALID_ARGUMENT,
                  "n_out and finished are required (tokens when capacity > 0)");
    }
    std::unique_lock<std::mutex> lock(rt->mu);
    auto ready = [&] {
      auto it = rt->requests.find(id);
      return rt->stop || it == rt->requests.end() || !it->second.pending.empty() ||
             it->second.finished;
    };
    if (timeout_ms < 0) {
      rt->out.wait(lock, ready);
    } else if (!rt->out.wait_for(lock, std::chrono::milliseconds(timeout_ms), ready)) {
      return fail(rt, DSV41RT_E_TIMEOUT, "nothing new for request " + std::to_string(id));
    }
    auto it = rt->requests.find(id);
    if (it == rt->requests.end())
      return fail(rt, DSV41RT_E_NOT_FOUND, "unknown request id " + std::to_string(id));
    if (it->second.callback) {
      return fail(rt, DSV41RT_E_INVALID_ARGUMENT,
                  "request " + std::to_string(id) + " delivers through its callback");
    }
    return take(rt, it->second, id, tokens, capacity, n_out, finished);
  });
}

dsv41rt_status dsv41rt_cancel(dsv41rt_runtime* rt, int64_t id) {
  return guarded(rt, [&]() -> dsv41rt_status {
    std::unique_lock<std::mutex> lock(rt->mu);
    auto it = rt->requests.find(id);
    if (it == rt->requests.end())
      return fail(rt, DSV41RT_E_NOT_FOUND, "unknown request id " + std::to_string(id));
    if (!it->second.finished) {
      rt->engine->cancel(id);  // frees its pages now
      it->second.finished = true;
      ++rt->finished_total;
    }
    dsv41rt_token_callback cb = it->second.callback;
    void* ud = it->second.user_data;
    if (cb) rt->requests.erase(it);
    lock.unlock();
    if (cb) cb(id, nullptr, 0, 1, ud);
    rt->out.notify_all();
    return DSV41RT_OK;
  });
}

dsv41rt_status dsv41rt_get_stats(dsv41rt_runtime* rt, dsv41rt_stats* out) {
  return guarded(rt, [&]() -> dsv41rt_status {
    if (!out) return fail(rt, DSV41RT_E_INVALID_ARGUMENT, "out is NULL");
    if (out->struct_size != sizeof(*out)) {
      return fail(rt, DSV41RT_E_ABI_MISMATCH,
                  "dsv41rt_stats.struct_size is not this library's (dsv41rt_stats_init)");
    }
    std::lock_guard<std::mutex> lock(rt->mu);
    const dsv41rt::engine::EngineStats s = rt->engine->stats();
    out->requests_running = s.scheduler.running;
    out->requests_waiting = s.scheduler.waiting;
    out->requests_finished = rt->finished_total;
    out->preemptions = s.scheduler.preemptions;
    out->pages_total = s.pool.pages_total;
    out->pages_used = s.pool.pages_used;
    out->page_tokens = rt->engine->executor().pool().geometry().page_tokens;
    out->tokens_generated = s.tokens_generated;
    out->steps = s.steps;
    return DSV41RT_OK;
  });
}

}  // extern "C"
