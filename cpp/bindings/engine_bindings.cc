// dsv41rt._core.Engine: one loaded model (an executor on its device and its KV pool) with two ways
// in:
//   - the serving engine: submit / step / cancel / stats (continuous batching, sampling);
//   - direct handles for scoring and parity tests: new_handle / forward / release run a request's
//     tokens through the executor without the scheduler (same pool, same state layout).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bindings/sampling_params.h"
#include "core/enum_names.h"
#include "core/safetensors.h"
#include "core/status.h"
#include "runtime/engine/engine.h"
#include "runtime/model/executor.h"
#include "runtime/model/model_config.h"

namespace nb = nanobind;

namespace dsv41rt::bindings {
namespace {

using engine::Engine;
using model::EngramTables;
using model::Executor;
using I32Array = nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

// kNone (still running) has no name.
const char* finish_reason_name(engine::FinishReason r) {
  static constexpr const char* kNames[] = {nullptr, "length", "stop", "abort"};
  return enum_name(r, kNames, nullptr);
}

class PyEngine {
 public:
  PyEngine(const std::string& path, nb::object token_map,
           const std::vector<nb::dict>& engram_layers, bool cache_quant, bool record_decisions,
           int64_t kv_memory_bytes, int64_t max_running, int64_t token_budget, int64_t max_context,
           int64_t page_tokens, const std::string& device, bool multistream, bool cuda_graphs,
           const std::string& precision, int64_t cp_size, const std::string& cp_comm,
           int64_t cp_rank, nb::bytes cp_id, bool cp_workers, nb::object progress) {
    ModelPlan plan = build_model_plan(load_model_config(path));
    auto ck = std::make_shared<Checkpoint>(path);
    EngramTables tables;
    if (plan.config.engram) {
      DSV41RT_CHECK(!token_map.is_none(), path,
                    ": this model has Engram layers; pass the tokenizer's normalised-token map");
      auto tm = nb::cast<I32Array>(token_map);
      tables.token_map.assign(tm.data(), tm.data() + tm.shape(0));
      for (const nb::dict& d : engram_layers) {
        EngramTables::Layer L;
        L.multipliers = nb::cast<std::vector<int64_t>>(d["multipliers"]);
        L.primes = nb::cast<std::vector<int64_t>>(d["primes"]);
        L.offsets = nb::cast<std::vector<int64_t>>(d["offsets"]);
        tables.layers.push_back(std::move(L));
      }
    }
    DSV41RT_CHECK(kv_memory_bytes > 0, "kv_memory_bytes must be positive, got ", kv_memory_bytes);
    DSV41RT_CHECK(max_running >= 1, "max_running must be >= 1, got ", max_running);
    DSV41RT_CHECK(token_budget >= 1, "token_budget must be >= 1, got ", token_budget);
    DSV41RT_CHECK(max_context >= 0, "max_context must be >= 0, got ", max_context);
    // The CPU backend computes from FP32 host copies; the CUDA backend dequantises the stored
    // tensors on the device (a released checkpoint does not fit in host memory as FP32).
    std::function<void(int64_t, int64_t)> report;
    if (!progress.is_none()) {
      report = [&progress](int64_t done, int64_t total) { progress(done, total); };  // GIL held
    }
    model::ModelWeights weights =
        model::load_weights(ck, plan, /*host_values=*/device == "cpu", report);
    model::ExecutorOptions options;
    options.cache_quant = cache_quant;
    options.record_decisions = record_decisions;
    options.kv_memory_bytes = kv_memory_bytes;
    options.max_requests = max_running;
    options.page_tokens = page_tokens;
    options.token_budget = token_budget;
    options.max_context = max_context;
    options.device = device;
    options.multistream = multistream;
    options.cuda_graphs = cuda_graphs;
    options.precision = precision;
    options.cp_size = cp_size;
    options.cp_comm = cp_comm;
    options.cp_rank = cp_rank;
    options.cp_id.assign(static_cast<const char*>(cp_id.data()), cp_id.size());
    options.cp_workers = cp_workers;
    std::shared_ptr<Executor> exec =
        model::make_executor(std::move(plan), std::move(weights), std::move(tables), options);
    engine_ = std::make_unique<Engine>(
        exec, engine::EngineConfig{max_running, token_budget, max_context});
  }

  ~PyEngine() {
    for (auto& [id, h] : handles_) free_handle(h);
  }

  // ---- engine ---------------------------------------------------------------------------------
  int64_t submit(std::vector<int32_t> prompt, int64_t max_new_tokens, nb::dict sampling,
                 std::vector<int32_t> stop_token_ids, bool ignore_eos) {
    engine::GenerationParams p;
    p.max_new_tokens = max_new_tokens;
    p.sampling = sampling_params_from_dict(sampling);
    p.stop_token_ids = std::move(stop_token_ids);
    p.ignore_eos = ignore_eos;
    return engine_->submit(std::move(prompt), p);
  }

  nb::list step() {
    std::vector<engine::RequestOutput> outs;
    {
      nb::gil_scoped_release release;  // the forward is pure C++ on engine-owned buffers
      outs = engine_->step();
    }
    nb::list result;
    for (const engine::RequestOutput& o : outs) {
      nb::dict d;
      d["id"] = o.id;
      d["new_tokens"] = o.new_tokens;
      d["logprobs"] = o.logprobs;
      d["top_ids"] = o.top_ids;
      d["top_logprobs"] = o.top_logprobs;
      d["finished"] = o.finished;
      const char* reason = finish_reason_name(o.reason);
      d["finish_reason"] = reason ? nb::cast(std::string(reason)) : nb::none();
      result.append(d);
    }
    return result;
  }

  void cancel(int64_t id) { engine_->cancel(id); }
  bool idle() const { return engine_->idle(); }
  void check_invariants() const { engine_->check_invariants(); }

  std::map<std::string, int64_t> stats() const {
    const engine::EngineStats s = engine_->stats();
    return {{"pages_total", s.pool.pages_total},
            {"pages_used", s.pool.pages_used},
            {"slots_total", s.pool.slots_total},
            {"slots_used", s.pool.slots_used},
            {"pool_bytes", s.pool.bytes_total},
            {"page_tokens", exec().pool().geometry().page_tokens},
            {"page_bytes", exec().pool().geometry().page_bytes},
            {"slot_bytes", exec().pool().geometry().slot_bytes},
            {"workspace_bytes_per_page", exec().memory_plan().workspace_bytes_per_page},
            {"scratch_bytes", exec().memory_plan().scratch_bytes},
            {"waiting", s.scheduler.waiting},
            {"running", s.scheduler.running},
            {"preemptions", s.scheduler.preemptions},
            {"admitted", s.scheduler.admitted},
            {"finished", s.scheduler.finished},
            {"aborted", s.scheduler.aborted},
            {"max_waiting_seen", s.scheduler.max_waiting_seen},
            {"steps", s.steps},
            {"tokens_computed", s.tokens_computed},
            {"tokens_generated", s.tokens_generated},
            {"dequant_calls", s.dequant.dequant_calls},
            {"reuse_hits", s.dequant.reuse_hits},
            {"rows_dequantised", s.dequant.rows_dequantised}};
  }

  std::map<std::string, int64_t> backend_stats() const { return exec().backend_stats(); }
  std::string device() const { return exec().device(); }
  void set_backend_option(const std::string& name, bool on) { exec().set_backend_option(name, on); }

  std::string describe_pool() {
    return exec().pool().describe() + "\n" + exec().memory_plan().describe();
  }

  // ---- direct handles -------------------------------------------------------------------------
  int64_t new_handle() {
    Handle h;
    h.slot = exec().pool().alloc_slot();
    DSV41RT_CHECK_CODE(kOutOfRange, h.slot >= 0, "no free request slot: ", exec().pool().describe(),
                       "; release a handle or finish requests first");
    handles_.emplace(next_handle_, std::move(h));
    return next_handle_++;
  }

  nb::ndarray<nb::numpy, float> forward(int64_t hid, I32Array tokens, bool all_logits) {
    Handle& h = handle(hid);
    const int64_t n = tokens.shape(0);
    DSV41RT_CHECK(n > 0, "forward: empty token list for handle ", hid);
    const int64_t V = exec().plan().config.vocab_size, rows = all_logits ? n : 1;
    float* out = new float[rows * V];
    nb::capsule owner(out, [](void* p) noexcept { delete[] static_cast<float*>(p); });
    {
      nb::gil_scoped_release release;
      DSV41RT_CHECK_CODE(kOutOfRange, exec().pool().ensure_pages(h.pages, h.length + n),
                         "KV pool exhausted: handle ", hid, " needs ", h.length + n, " positions; ",
                         exec().pool().describe());
      std::vector<model::BatchItem> batch(1);
      batch[0].request = {exec().pool().slot_data(h.slot), h.pages.data(), int64_t(h.pages.size()),
                          h.length};
      batch[0].tokens = tokens.data();
      batch[0].n = n;
      batch[0].logits = out;
      batch[0].all_logits = all_logits;
      exec().forward(batch);
      h.length += n;
    }
    return nb::ndarray<nb::numpy, float>(out, {size_t(rows), size_t(V)}, owner);
  }

  // A new handle holding a copy of `hid`'s state (prefix sharing by copy).
  int64_t fork(int64_t hid) {
    Handle& src = handle(hid);
    const int64_t id = new_handle();
    Handle& dst = handles_.at(id);
    nb::gil_scoped_release release;
    if (!exec().pool().ensure_pages(dst.pages, src.length)) {
      free_handle(dst);
      handles_.erase(id);
      DSV41RT_THROW_CODE(kOutOfRange, "KV pool exhausted: fork of handle ", hid, " needs ",
                         src.length, " positions; ", exec().pool().describe());
    }
    exec().copy_state(view(src), view(dst));
    dst.length = src.length;
    return id;
  }

  // One token for each handle in one batched forward (a decode step); the logits [B, vocab].
  nb::ndarray<nb::numpy, float> decode(const std::vector<int64_t>& hids, I32Array tokens) {
    const int64_t B = int64_t(hids.size());
    DSV41RT_CHECK(B > 0 && tokens.shape(0) == size_t(B), "decode: ", hids.size(), " handles and ",
                  tokens.shape(0), " tokens");
    for (int64_t i = 0; i < B; ++i) {
      for (int64_t j = 0; j < i; ++j) {
        DSV41RT_CHECK(hids[i] != hids[j], "decode: handle ", hids[i], " given twice");
      }
    }
    const int64_t V = exec().plan().config.vocab_size;
    float* out = new float[B * V];
    nb::capsule owner(out, [](void* p) noexcept { delete[] static_cast<float*>(p); });
    {
      nb::gil_scoped_release release;
      std::vector<model::BatchItem> batch(static_cast<size_t>(B));
      for (int64_t i = 0; i < B; ++i) {
        Handle& h = handle(hids[i]);
        DSV41RT_CHECK_CODE(kOutOfRange, exec().pool().ensure_pages(h.pages, h.length + 1),
                           "KV pool exhausted: handle ", hids[i], "; ", exec().pool().describe());
        batch[i].request = view(h);
        batch[i].tokens = tokens.data() + i;
        batch[i].n = 1;
        batch[i].logits = out + i * V;
        batch[i].all_logits = false;
      }
      exec().forward(batch);
      for (int64_t hid : hids) handle(hid).length += 1;
    }
    return nb::ndarray<nb::numpy, float>(out, {size_t(B), size_t(V)}, owner);
  }

  void run_cp_worker() { exec().run_cp_worker(); }

  void release(int64_t hid) {
    free_handle(handle(hid));
    handles_.erase(hid);
  }

  nb::dict decisions() const {
    nb::dict out;
    const auto& all = engine_->executor().decisions();
    for (const auto& [name, values] : all) {
      const ModelConfig& c = engine_->executor().plan().config;
      int64_t cols = c.index_topk;
      if (name.rfind("experts_L", 0) == 0) {
        const int layer = std::stoi(name.substr(9));
        cols = engine_->executor().plan().layers[layer].experts_per_tok;
      }
      auto* data = new int32_t[values.empty() ? 1 : values.size()];
      std::copy(values.begin(), values.end(), data);
      nb::capsule owner(data, [](void* p) noexcept { delete[] static_cast<int32_t*>(p); });
      out[name.c_str()] = nb::ndarray<nb::numpy, int32_t>(
          data, {values.size() / size_t(cols), size_t(cols)}, owner);
    }
    return out;
  }

  void reset_counters() { exec().workspaces().reset_counters(); }
  void set_dequant_reuse(bool on) { exec().workspaces().set_reuse(on); }

 private:
  struct Handle {
    int32_t slot = -1;
    std::vector<int32_t> pages;
    int64_t length = 0;
  };

  Executor& exec() const { return engine_->executor(); }
  model::RequestView view(const Handle& h) const {
    return {exec().pool().slot_data(h.slot), h.pages.data(), int64_t(h.pages.size()), h.length};
  }

  void free_handle(Handle& h) {
    exec().pool().free_pages(h.pages);
    if (h.slot >= 0) exec().pool().free_slot(h.slot);
    h.slot = -1;
  }

  Handle& handle(int64_t hid) {
    auto it = handles_.find(hid);
    DSV41RT_CHECK_CODE(kNotFound, it != handles_.end(), "unknown handle ", hid);
    return it->second;
  }

  std::unique_ptr<Engine> engine_;
  std::map<int64_t, Handle> handles_;
  int64_t next_handle_ = 1;
};

}  // namespace

void register_engine(nb::module_& m) {
  nb::class_<PyEngine>(m, "Engine",
                       "A loaded V4.1 checkpoint on an executor (cpu or cuda): serving engine "
                       "(submit/step/cancel/stats) and direct handles (forward).")
      .def(nb::init<const std::string&, nb::object, const std::vector<nb::dict>&, bool, bool,
                    int64_t, int64_t, int64_t, int64_t, int64_t, const std::string&, bool, bool,
                    const std::string&, int64_t, const std::string&, int64_t, nb::bytes, bool,
                    nb::object>(),
           nb::arg("path"), nb::arg("token_map") = nb::none(),
           nb::arg("engram_layers") = std::vector<nb::dict>{}, nb::kw_only(),
           nb::arg("cache_quant") = true, nb::arg("record_decisions") = false,
           nb::arg("kv_memory_bytes") = int64_t(256) << 20, nb::arg("max_running") = 64,
           nb::arg("token_budget") = 512, nb::arg("max_context") = 0, nb::arg("page_tokens") = 64,
           nb::arg("device") = "cpu", nb::arg("multistream") = true, nb::arg("cuda_graphs") = true,
           nb::arg("precision") = "fp32", nb::arg("cp_size") = 1, nb::arg("cp_comm") = "local",
           nb::arg("cp_rank") = -1, nb::arg("cp_id") = nb::bytes(""), nb::arg("cp_workers") = false,
           nb::arg("progress") = nb::none())
      .def("submit", &PyEngine::submit, nb::arg("prompt"), nb::arg("max_new_tokens"),
           nb::arg("sampling") = nb::dict(), nb::arg("stop_token_ids") = std::vector<int32_t>{},
           nb::arg("ignore_eos") = false)
      .def("step", &PyEngine::step)
      .def("cancel", &PyEngine::cancel, nb::arg("id"))
      .def("idle", &PyEngine::idle)
      .def("stats", &PyEngine::stats)
      .def("backend_stats", &PyEngine::backend_stats)
      .def("set_backend_option", &PyEngine::set_backend_option, nb::arg("name"), nb::arg("on"))
      .def_prop_ro("device", &PyEngine::device)
      .def("check_invariants", &PyEngine::check_invariants)
      .def("describe_pool", &PyEngine::describe_pool)
      .def("new_handle", &PyEngine::new_handle)
      .def("forward", &PyEngine::forward, nb::arg("handle"), nb::arg("tokens"),
           nb::arg("all_logits") = true)
      .def("release", &PyEngine::release, nb::arg("handle"))
      .def(
          "run_cp_worker",
          [](PyEngine& e) {
            nb::gil_scoped_release release;
            e.run_cp_worker();
          },
          "Context-parallel rank > 0 in its own process: replay rank 0's calls until it shuts "
          "down.")
      .def("fork", &PyEngine::fork, nb::arg("handle"),
           "A new handle with a copy of the handle's state (continues exactly as it would).")
      .def("decode", &PyEngine::decode, nb::arg("handles"), nb::arg("tokens"),
           "One token per handle in one batched forward; returns the logits [B, vocab].")
      .def("decisions", &PyEngine::decisions)
      .def("reset_counters", &PyEngine::reset_counters)
      .def("set_dequant_reuse", &PyEngine::set_dequant_reuse, nb::arg("on"));
}

}  // namespace dsv41rt::bindings
