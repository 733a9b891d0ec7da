// dsv41rt._core.Runtime: the C++ facade (include/dsv41rt/runtime.hpp) for Python, with its typed
// options (RuntimeOptions and its groups), outputs and stats. Calls that wait or run a forward
// release the GIL; the engine thread never takes it (Python consumes outputs with await_any).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <string>
#include <vector>

#include "bindings/sampling_params.h"
#include "core/status.h"
#include "dsv41rt/dsv41rt.h"
#include "dsv41rt/runtime.hpp"

namespace nb = nanobind;

namespace dsv41rt::bindings {
namespace {

using I32Array = nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using F32Out = nb::ndarray<nb::numpy, float>;

std::chrono::milliseconds millis(double seconds) {
  DSV41RT_CHECK(seconds >= 0, "timeout must be >= 0 seconds, got ", seconds);
  return std::chrono::milliseconds(int64_t(seconds * 1000.0 + 0.5));
}

// A request's params from the Python Runtime's arguments (sampling / grammar dictionaries).
RequestParams request_params(int64_t max_new_tokens, const nb::dict& sampling,
                             std::vector<int32_t> stop_token_ids, bool ignore_eos,
                             const nb::dict& grammar) {
  RequestParams p;
  p.max_new_tokens = max_new_tokens;
  p.sampling = sampling_params_from_dict<SamplingParams>(sampling);
  p.stop_token_ids = std::move(stop_token_ids);
  p.ignore_eos = ignore_eos;
  p.grammar = grammar_params_from_dict(grammar);
  return p;
}

// A float32 numpy array of `rows` x `cols` filled by `fill` with the GIL released.
template <class Fill>
F32Out logits_array(int64_t rows, int64_t cols, Fill&& fill) {
  float* out = new float[size_t(rows * cols)];
  nb::capsule owner(out, [](void* p) noexcept { delete[] static_cast<float*>(p); });
  {
    nb::gil_scoped_release release;
    fill(out);
  }
  return F32Out(out, {size_t(rows), size_t(cols)}, owner);
}

// Decisions as numpy arrays keyed "topk_L<l>" / "experts_L<l>" (int32), "window_kv_L<l>" and
// "dspark_features_L<l>" (float32), V4's MTP "mtp_streams_S<s>" / "mtp_logits_S<s>" (float32),
// rows x width.
// One numpy array per layer of `values` (rows x width(layer)), under prefix + layer.
template <typename T, typename Width>
void add_layer_arrays(nb::dict& out, const char* prefix,
                      const std::map<int, std::vector<T>>& values, Width width) {
  for (const auto& [layer, v] : values) {
    const size_t cols = size_t(width(layer));
    auto* data = new T[v.empty() ? 1 : v.size()];
    std::copy(v.begin(), v.end(), data);
    nb::capsule owner(data, [](void* p) noexcept { delete[] static_cast<T*>(p); });
    const std::string key = std::string(prefix) + std::to_string(layer);
    out[key.c_str()] = nb::ndarray<nb::numpy, T>(data, {v.size() / cols, cols}, owner);
  }
}

nb::dict decisions_dict(const Decisions& d) {
  nb::dict out;
  add_layer_arrays(out, "topk_L", d.topk, [&](int l) { return d.topk_width.at(l); });
  add_layer_arrays(out, "experts_L", d.experts, [&](int l) { return d.experts_width.at(l); });
  add_layer_arrays(out, "window_kv_L", d.window_kv, [&](int) { return d.window_kv_width; });
  add_layer_arrays(out, "dspark_features_L", d.dspark_features, [&](int) { return d.hidden; });
  add_layer_arrays(out, "mtp_streams_S", d.mtp_streams, [&](int) { return d.mtp_streams_width; });
  add_layer_arrays(out, "mtp_logits_S", d.mtp_logits, [&](int) { return d.mtp_logits_width; });
  return out;
}

void register_options(nb::module_& m) {
  nb::enum_<Precision>(m, "Precision")
      .value("fp32", Precision::kFp32)
      .value("bf16", Precision::kBf16)
      .value("fp8", Precision::kFp8);
  nb::enum_<KvCacheDtype>(m, "KvCacheDtype")
      .value("auto", KvCacheDtype::kAuto)
      .value("float32", KvCacheDtype::kFloat32);
  nb::enum_<CpBackend>(m, "CpBackend")
      .value("local", CpBackend::kLocal)
      .value("nccl", CpBackend::kNccl)
      .value("socket", CpBackend::kSocket);
  nb::enum_<Switch>(m, "Switch")
      .value("multistream", Switch::kMultistream)
      .value("cuda_graphs", Switch::kCudaGraphs)
      .value("tensor_cores", Switch::kTensorCores)
      .value("cp_timing", Switch::kCpTiming)
      .value("attention_in_place", Switch::kAttentionInPlace)
      .value("programmatic_launch", Switch::kProgrammaticLaunch);
  nb::enum_<FinishReason>(m, "FinishReason")
      .value("none", FinishReason::kNone)
      .value("length", FinishReason::kLength)
      .value("stop", FinishReason::kStop)
      .value("abort", FinishReason::kAborted)
      .value("error", FinishReason::kError);

  nb::class_<PoolOptions>(m, "PoolOptions")
      .def(nb::init<>())
      .def_rw("kv_memory", &PoolOptions::kv_memory)
      .def_rw("max_num_seqs", &PoolOptions::max_num_seqs)
      .def_rw("max_num_batched_tokens", &PoolOptions::max_num_batched_tokens)
      .def_rw("max_model_len", &PoolOptions::max_model_len)
      .def_rw("page_size", &PoolOptions::page_size)
      .def_rw("max_prefill_tokens_while_decoding", &PoolOptions::max_prefill_tokens_while_decoding)
      .def_rw("max_decode_slowdown", &PoolOptions::max_decode_slowdown)
      .def_rw("enable_prefix_caching", &PoolOptions::enable_prefix_caching)
      .def_rw("host_cache_memory", &PoolOptions::host_cache_memory);
  nb::class_<NumericsOptions>(m, "NumericsOptions")
      .def(nb::init<>())
      .def_rw("precision", &NumericsOptions::precision)
      .def_rw("kv_cache_dtype", &NumericsOptions::kv_cache_dtype);
  nb::class_<DeviceOptions>(m, "DeviceOptions")
      .def(nb::init<>())
      .def_rw("device", &DeviceOptions::device)
      .def_rw("enforce_eager", &DeviceOptions::enforce_eager)
      .def_rw("multistream", &DeviceOptions::multistream)
      .def_rw("engram_host_memory", &DeviceOptions::engram_host_memory);
  nb::class_<ParallelOptions>(m, "ParallelOptions")
      .def(nb::init<>())
      .def_rw("context_parallel_size", &ParallelOptions::context_parallel_size)
      .def_rw("context_parallel_backend", &ParallelOptions::context_parallel_backend)
      .def_rw("expert_parallel_size", &ParallelOptions::expert_parallel_size)
      .def_rw("tensor_parallel_size", &ParallelOptions::tensor_parallel_size)
      .def_rw("rank", &ParallelOptions::rank)
      .def_prop_rw(
          "group_id",
          [](const ParallelOptions& p) { return nb::bytes(p.group_id.data(), p.group_id.size()); },
          [](ParallelOptions& p, nb::bytes b) {
            p.group_id.assign(static_cast<const char*>(b.data()), b.size());
          })
      .def_rw("worker_threads", &ParallelOptions::worker_threads);
  nb::class_<RuntimeOptions>(m, "RuntimeOptions")
      .def(nb::init<>())
      .def_rw("checkpoint", &RuntimeOptions::checkpoint)
      .def_rw("engram_tables", &RuntimeOptions::engram_tables)
      .def_rw("pool", &RuntimeOptions::pool)
      .def_rw("numerics", &RuntimeOptions::numerics)
      .def_rw("device", &RuntimeOptions::device)
      .def_rw("parallel", &RuntimeOptions::parallel)
      .def_rw("record_decisions", &RuntimeOptions::record_decisions)
      .def_rw("load_drafter", &RuntimeOptions::load_drafter)
      .def_rw("num_speculative_tokens", &RuntimeOptions::num_speculative_tokens)
      .def_rw("speculative_disable_by_batch_size",
              &RuntimeOptions::speculative_disable_by_batch_size)
      // A Python callable (id, tokens, k) -> drafts; nanobind takes the GIL to call it from the
      // engine (Runtime.step releases it).
      .def_rw("draft_source", &RuntimeOptions::draft_source)
      // A Python callable (id, drafted) -> accepted count (benchmarks; not lossless), called the
      // same way.
      .def_rw("forced_acceptance", &RuntimeOptions::forced_acceptance)
      .def_rw("engine_thread", &RuntimeOptions::engine_thread);
  nb::class_<DraftBlock>(m, "DraftBlock")
      .def_ro("tokens", &DraftBlock::tokens)
      .def_ro("confidence", &DraftBlock::confidence);

  // The C API's defaults (dsv41rt_runtime_default_params), for the test that all ways in agree.
  m.def("c_api_defaults", [] {
    dsv41rt_runtime_params p;
    dsv41rt_runtime_default_params(&p);
    nb::dict d;
    d["device"] = std::string(p.device);
    d["precision"] = p.precision == DSV41RT_PRECISION_BF16 ? "bf16" : "fp32";
    d["kv_cache_dtype"] = p.kv_cache_dtype == DSV41RT_KV_CACHE_FLOAT32 ? "float32" : "auto";
    d["kv_memory"] = p.kv_memory;
    d["max_num_seqs"] = p.max_num_seqs;
    d["max_num_batched_tokens"] = p.max_num_batched_tokens;
    d["max_model_len"] = p.max_model_len;
    d["page_size"] = p.page_size;
    d["enforce_eager"] = p.enforce_eager != 0;
    d["max_prefill_tokens_while_decoding"] = p.max_prefill_tokens_while_decoding;
    d["max_decode_slowdown"] = p.max_decode_slowdown;
    d["enable_prefix_caching"] = p.enable_prefix_caching != 0;
    d["host_cache_memory"] = p.host_cache_memory;
    d["tensor_parallel_size"] = p.tensor_parallel_size;
    d["expert_parallel_size"] = p.expert_parallel_size;
    d["speculative_config"] =
        p.speculative_config ? nb::object(nb::str(p.speculative_config)) : nb::none();
    return d;
  });
}

void register_results(nb::module_& m) {
  nb::class_<RequestOutput>(m, "RequestOutput")
      .def_ro("id", &RequestOutput::id)
      .def_ro("tokens", &RequestOutput::tokens)
      .def_ro("logprobs", &RequestOutput::logprobs)
      .def_ro("top_ids", &RequestOutput::top_ids)
      .def_ro("top_logprobs", &RequestOutput::top_logprobs)
      .def_ro("finished", &RequestOutput::finished)
      .def_ro("reason", &RequestOutput::reason)
      .def_ro("error", &RequestOutput::error)
      .def_ro("first_scheduled_ns", &RequestOutput::first_scheduled_ns)
      .def_ro("cached_tokens", &RequestOutput::cached_tokens)
      .def_prop_ro("handoff", [](const RequestOutput& o) -> nb::object {
        if (o.handoff.empty()) return nb::none();
        return nb::bytes(reinterpret_cast<const char*>(o.handoff.data()), o.handoff.size());
      });

#define DSV41RT_RO(Cls, field) .def_ro(#field, &Cls::field)
  nb::class_<PoolStats>(m, "PoolStats") DSV41RT_RO(PoolStats, pages_total)
      DSV41RT_RO(PoolStats, pages_used) DSV41RT_RO(PoolStats, slots_total)
          DSV41RT_RO(PoolStats, slots_used) DSV41RT_RO(PoolStats, bytes_total)
              DSV41RT_RO(PoolStats, page_size) DSV41RT_RO(PoolStats, page_bytes)
                  DSV41RT_RO(PoolStats, slot_bytes) DSV41RT_RO(PoolStats, workspace_bytes_per_page)
                      DSV41RT_RO(PoolStats, scratch_bytes) DSV41RT_RO(PoolStats, pages_cached)
                          DSV41RT_RO(PoolStats, slots_cached);
  nb::class_<PrefixCacheStats>(m, "PrefixCacheStats") DSV41RT_RO(PrefixCacheStats, queries)
      DSV41RT_RO(PrefixCacheStats, hits) DSV41RT_RO(PrefixCacheStats, evicted_pages)
          DSV41RT_RO(PrefixCacheStats, evicted_snapshots) DSV41RT_RO(PrefixCacheStats, host_pages)
              DSV41RT_RO(PrefixCacheStats, host_bytes) DSV41RT_RO(PrefixCacheStats, offloaded_pages)
                  DSV41RT_RO(PrefixCacheStats, restored_pages)
                      DSV41RT_RO(PrefixCacheStats, offloaded_snapshots)
                          DSV41RT_RO(PrefixCacheStats, restored_snapshots);
  nb::class_<SchedulerStats>(m, "SchedulerStats") DSV41RT_RO(SchedulerStats, waiting)
      DSV41RT_RO(SchedulerStats, running) DSV41RT_RO(SchedulerStats, preemptions)
          DSV41RT_RO(SchedulerStats, admitted) DSV41RT_RO(SchedulerStats, finished)
              DSV41RT_RO(SchedulerStats, aborted) DSV41RT_RO(SchedulerStats, max_waiting_seen);
  nb::class_<DequantStats>(m, "DequantStats") DSV41RT_RO(DequantStats, dequant_calls)
      DSV41RT_RO(DequantStats, reuse_hits) DSV41RT_RO(DequantStats, rows_dequantised)
          DSV41RT_RO(DequantStats, reallocations);
  nb::class_<BackendStats>(m, "BackendStats") DSV41RT_RO(BackendStats, weight_bytes) DSV41RT_RO(
      BackendStats, weight_host_bytes) DSV41RT_RO(BackendStats, weight_host_in_place_bytes)
      DSV41RT_RO(BackendStats, d2h_bytes) DSV41RT_RO(BackendStats, eager_forwards)
          DSV41RT_RO(BackendStats, graph_captures) DSV41RT_RO(BackendStats, graph_replays)
              DSV41RT_RO(BackendStats, graph_updates) DSV41RT_RO(BackendStats, programmatic_edges)
                  DSV41RT_RO(BackendStats, graphs) DSV41RT_RO(BackendStats, last_forward_us)
                      DSV41RT_RO(BackendStats, multistream) DSV41RT_RO(BackendStats, cuda_graphs)
                          DSV41RT_RO(BackendStats, tensor_cores) DSV41RT_RO(BackendStats, cp_size)
                              DSV41RT_RO(BackendStats, cp_forwards)
                                  DSV41RT_RO(BackendStats, cp_processes)
                                      DSV41RT_RO(BackendStats, tp_size)
                                          DSV41RT_RO(BackendStats, ep_size)
                                              DSV41RT_RO(BackendStats, cp_layers_timed)
                                                  DSV41RT_RO(BackendStats, cp_q_projection_us)
                                                      DSV41RT_RO(BackendStats, cp_all_gather_us)
                                                          DSV41RT_RO(BackendStats, cp_overlap_us);
  nb::class_<SpecDecodeStats>(m, "SpecDecodeStats") DSV41RT_RO(SpecDecodeStats, drafts)
      DSV41RT_RO(SpecDecodeStats, draft_tokens) DSV41RT_RO(SpecDecodeStats, accepted_tokens)
          DSV41RT_RO(SpecDecodeStats, accepted_per_pos);
  nb::class_<Stats>(m, "Stats") DSV41RT_RO(Stats, pool) DSV41RT_RO(Stats, scheduler)
      DSV41RT_RO(Stats, dequant) DSV41RT_RO(Stats, backend) DSV41RT_RO(Stats, steps)
          DSV41RT_RO(Stats, tokens_computed) DSV41RT_RO(Stats, tokens_generated)
              DSV41RT_RO(Stats, prefix_cache) DSV41RT_RO(Stats, spec_decode);
#undef DSV41RT_RO
  nb::class_<ModelInfo>(m, "ModelInfo")
      .def_ro("vocab_size", &ModelInfo::vocab_size)
      .def_ro("eos_token_id", &ModelInfo::eos_token_id)
      .def_ro("device", &ModelInfo::device);
}

}  // namespace

void register_runtime(nb::module_& m) {
  register_options(m);
  register_results(m);
  nb::class_<Runtime>(m, "Runtime",
                      "A loaded V4.1 checkpoint: engine, engine thread (unless "
                      "options.engine_thread is False) and direct sequences.")
      .def(
          "__init__",
          [](Runtime* self, RuntimeOptions options, nb::object progress) {
            if (!progress.is_none()) {
              options.progress = [progress](int64_t done, int64_t total) {
                nb::gil_scoped_acquire gil;
                progress(done, total);
              };
            }
            nb::gil_scoped_release release;
            new (self) Runtime(std::move(options));
          },
          nb::arg("options"), nb::arg("progress") = nb::none())
      .def(
          "submit",
          [](Runtime& rt, std::vector<int32_t> prompt, int64_t max_new_tokens, nb::dict sampling,
             std::vector<int32_t> stop_token_ids, bool ignore_eos, nb::dict grammar, bool handoff) {
            RequestParams p = request_params(max_new_tokens, sampling, std::move(stop_token_ids),
                                             ignore_eos, grammar);
            p.handoff = handoff;
            nb::gil_scoped_release release;  // a grammar compiles here (milliseconds and more)
            return rt.submit(std::move(prompt), p);
          },
          nb::arg("prompt"), nb::arg("max_new_tokens"), nb::arg("sampling") = nb::dict(),
          nb::arg("stop_token_ids") = std::vector<int32_t>{}, nb::arg("ignore_eos") = false,
          nb::arg("grammar") = nb::dict(), nb::arg("handoff") = false,
          "Queues a request. grammar: {} or {kind, text, start_token, start_within} "
          "(dsv41rt/runtime.hpp GrammarParams). handoff: end after the first token with the "
          "request's state in the output (prefill role).")
      .def(
          "submit_handoff",
          [](Runtime& rt, std::vector<int32_t> prompt, int32_t first_token, nb::bytes state,
             int64_t max_new_tokens, nb::dict sampling, std::vector<int32_t> stop_token_ids,
             bool ignore_eos, nb::dict grammar) {
            const RequestParams p = request_params(max_new_tokens, sampling,
                                                   std::move(stop_token_ids), ignore_eos, grammar);
            const auto* data = static_cast<const uint8_t*>(state.data());
            std::vector<uint8_t> blob(data, data + state.size());
            nb::gil_scoped_release release;
            return rt.submit_handoff(std::move(prompt), first_token, std::move(blob), p);
          },
          nb::arg("prompt"), nb::arg("first_token"), nb::arg("state"), nb::arg("max_new_tokens"),
          nb::arg("sampling") = nb::dict(), nb::arg("stop_token_ids") = std::vector<int32_t>{},
          nb::arg("ignore_eos") = false, nb::arg("grammar") = nb::dict(),
          "Continues a request another runtime prefilled (decode role; dsv41rt/runtime.hpp).")
      .def(
          "set_grammar_vocab",
          [](Runtime& rt, const std::vector<nb::bytes>& tokens,
             const std::vector<int32_t>& stop_token_ids) {
            std::vector<std::string> t;
            t.reserve(tokens.size());
            for (const nb::bytes& b : tokens) t.emplace_back(b.c_str(), b.size());
            nb::gil_scoped_release release;
            rt.set_grammar_vocab(t, stop_token_ids);
          },
          nb::arg("tokens"), nb::arg("stop_token_ids"),
          "The vocabulary grammars compile against: the bytes of each token (b'' for control "
          "tokens) and the stop tokens.")
      .def_static("grammar_available", &Runtime::grammar_available,
                  "Whether this build has grammar-constrained decoding (xgrammar).")
      .def(
          "await_output",
          [](Runtime& rt, int64_t id, double timeout_s) {
            const auto t = millis(timeout_s);
            nb::gil_scoped_release release;
            return rt.await(id, t);
          },
          nb::arg("id"), nb::arg("timeout_s"))
      .def(
          "await_any",
          [](Runtime& rt, double timeout_s) {
            const auto t = millis(timeout_s);
            nb::gil_scoped_release release;
            return rt.await_any(t);
          },
          nb::arg("timeout_s"))
      .def("cancel", &Runtime::cancel, nb::arg("id"), nb::arg("wait") = true,
           nb::call_guard<nb::gil_scoped_release>())
      .def("step", &Runtime::step, nb::call_guard<nb::gil_scoped_release>())
      .def("idle", &Runtime::idle)
      .def("shutdown", &Runtime::shutdown, nb::call_guard<nb::gil_scoped_release>())
      .def("stats", &Runtime::stats)
      .def("info", &Runtime::info)
      .def("decisions", [](const Runtime& rt) { return decisions_dict(rt.decisions()); })
      .def("describe_pool", &Runtime::describe_pool)
      .def("check_invariants", &Runtime::check_invariants)
      .def("set_switch", &Runtime::set_switch, nb::arg("which"), nb::arg("on"))
      .def("set_dequant_reuse", &Runtime::set_dequant_reuse, nb::arg("on"))
      .def("reset_dequant_counters", &Runtime::reset_dequant_counters)
      .def("reset_prefix_cache", &Runtime::reset_prefix_cache)
      .def("run_cp_worker", &Runtime::run_cp_worker, nb::call_guard<nb::gil_scoped_release>())
      .def("open_sequence", &Runtime::open_sequence)
      .def(
          "forward",
          [](Runtime& rt, int64_t seq, I32Array tokens, bool all_logits, bool undoable) {
            const int64_t n = int64_t(tokens.shape(0));
            DSV41RT_CHECK(n > 0, "forward: empty token list for sequence ", seq);
            return logits_array(all_logits ? n : 1, rt.info().vocab_size, [&](float* out) {
              rt.forward(seq, tokens.data(), n, all_logits, out, undoable);
            });
          },
          nb::arg("seq"), nb::arg("tokens"), nb::arg("all_logits") = true,
          nb::arg("undoable") = false)
      .def("rollback", &Runtime::rollback, nb::arg("seq"), nb::arg("r"),
           nb::call_guard<nb::gil_scoped_release>())
      .def("rollback_limit", &Runtime::rollback_limit, nb::arg("seq"))
      .def("verify_greedy", &Runtime::verify_greedy, nb::arg("seq"), nb::arg("last_token"),
           nb::arg("draft"), nb::call_guard<nb::gil_scoped_release>())
      .def("draft_greedy", &Runtime::draft_greedy, nb::arg("seq"), nb::arg("last_token"),
           nb::call_guard<nb::gil_scoped_release>())
      .def("fork", &Runtime::fork, nb::arg("seq"), nb::call_guard<nb::gil_scoped_release>())
      .def(
          "decode",
          [](Runtime& rt, const std::vector<int64_t>& seqs, I32Array tokens) {
            DSV41RT_CHECK(!seqs.empty() && tokens.shape(0) == seqs.size(), "decode: ", seqs.size(),
                          " handles and ", tokens.shape(0), " tokens");
            return logits_array(int64_t(seqs.size()), rt.info().vocab_size,
                                [&](float* out) { rt.decode(seqs, tokens.data(), out); });
          },
          nb::arg("seqs"), nb::arg("tokens"))
      .def(
          "decode_greedy",
          [](Runtime& rt, const std::vector<int64_t>& seqs, I32Array tokens) {
            DSV41RT_CHECK(!seqs.empty() && tokens.shape(0) == seqs.size(),
                          "decode_greedy: ", seqs.size(), " handles and ", tokens.shape(0),
                          " tokens");
            const size_t B = seqs.size();
            auto* next = new int32_t[B];
            auto* lps = new float[B];
            nb::capsule next_owner(next,
                                   [](void* p) noexcept { delete[] static_cast<int32_t*>(p); });
            nb::capsule lps_owner(lps, [](void* p) noexcept { delete[] static_cast<float*>(p); });
            {
              nb::gil_scoped_release release;
              rt.decode_greedy(seqs, tokens.data(), next, lps);
            }
            return nb::make_tuple(nb::ndarray<nb::numpy, int32_t>(next, {B}, next_owner),
                                  nb::ndarray<nb::numpy, float>(lps, {B}, lps_owner));
          },
          nb::arg("seqs"), nb::arg("tokens"))
      .def("close_sequence", &Runtime::close_sequence, nb::arg("seq"))
      .def(
          "export_sequence",
          [](Runtime& rt, int64_t seq) {
            std::vector<uint8_t> blob;
            {
              nb::gil_scoped_release release;
              blob = rt.export_sequence(seq);
            }
            return nb::bytes(reinterpret_cast<const char*>(blob.data()), blob.size());
          },
          nb::arg("seq"))
      .def(
          "import_sequence",
          [](Runtime& rt, nb::bytes blob) {
            const auto* data = static_cast<const uint8_t*>(blob.data());
            const size_t size = blob.size();
            nb::gil_scoped_release release;  // the bytes object stays alive: the caller holds it
            return rt.import_sequence(data, size);
          },
          nb::arg("blob"));
}

}  // namespace dsv41rt::bindings
