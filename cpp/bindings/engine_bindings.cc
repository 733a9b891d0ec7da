// dsv41rt._core.Executor: the eager CPU executor with per-request state, for the Python Runtime
// and the score/generate CLI. Requests are integer handles owned by the executor object.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/model/executor.h"
#include "runtime/model/model_config.h"
#include "runtime/safetensors.h"
#include "runtime/status.h"

namespace nb = nanobind;

namespace dsv41rt::bindings {
namespace {

using model::CpuExecutor;
using model::EngramTables;
using model::RequestState;

class PyExecutor {
 public:
  PyExecutor(const std::string& path, nb::object token_map,
             const std::vector<nb::dict>& engram_layers, bool cache_quant, bool record_decisions) {
    ModelPlan plan = build_model_plan(load_model_config(path));
    auto ck = std::make_shared<Checkpoint>(path);
    EngramTables tables;
    if (plan.config.engram) {
      DSV41RT_CHECK(!token_map.is_none(), path,
                    ": this model has Engram layers; pass the tokenizer's normalised-token map");
      auto tm = nb::cast<nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>>(
          token_map);
      tables.token_map.assign(tm.data(), tm.data() + tm.shape(0));
      for (const nb::dict& d : engram_layers) {
        EngramTables::Layer L;
        L.multipliers = nb::cast<std::vector<int64_t>>(d["multipliers"]);
        L.primes = nb::cast<std::vector<int64_t>>(d["primes"]);
        L.offsets = nb::cast<std::vector<int64_t>>(d["offsets"]);
        tables.layers.push_back(std::move(L));
      }
    }
    model::ModelWeights weights = model::load_weights(ck, plan);
    model::ExecutorOptions options;
    options.cache_quant = cache_quant;
    options.record_decisions = record_decisions;
    exec_ = std::make_unique<CpuExecutor>(std::move(plan), std::move(weights), std::move(tables),
                                          options);
  }

  int64_t new_request() {
    requests_.emplace(next_id_, exec_->new_request());
    return next_id_++;
  }

  nb::ndarray<nb::numpy, float> forward(
      int64_t rid, nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu> tokens,
      bool all_logits) {
    RequestState& st = request(rid);
    const int64_t n = tokens.shape(0);
    DSV41RT_CHECK(n > 0, "forward: empty token list for request ", rid);
    const int64_t V = exec_->plan().config.vocab_size, rows = all_logits ? n : 1;
    float* out = new float[rows * V];
    nb::capsule owner(out, [](void* p) noexcept { delete[] static_cast<float*>(p); });
    {
      nb::gil_scoped_release release;  // the forward is pure C++ on owned buffers
      exec_->forward(st, tokens.data(), n, out, all_logits);
    }
    last_rows_ = size_t(n);
    return nb::ndarray<nb::numpy, float>(out, {size_t(rows), size_t(V)}, owner);
  }

  void release(int64_t rid) {
    DSV41RT_CHECK_CODE(kNotFound, requests_.erase(rid) == 1, "unknown request ", rid);
  }
  int64_t length(int64_t rid) { return request(rid).length; }

  std::map<std::string, int64_t> counters() const {
    const DequantCounters& c = exec_->workspaces().counters();
    return {{"dequant_calls", c.dequant_calls},
            {"reuse_hits", c.reuse_hits},
            {"rows_dequantised", c.rows_dequantised},
            {"reallocations", c.reallocations}};
  }
  void reset_counters() { exec_->workspaces().reset_counters(); }
  void set_dequant_reuse(bool on) { exec_->workspaces().set_reuse(on); }

  /// Decisions of the last forward, as int32 arrays [n, k].
  nb::dict decisions() const {
    nb::dict out;
    for (const auto& [name, values] : exec_->decisions()) {
      auto* data = new int32_t[values.empty() ? 1 : values.size()];
      std::copy(values.begin(), values.end(), data);
      nb::capsule owner(data, [](void* p) noexcept { delete[] static_cast<int32_t*>(p); });
      const size_t rows = last_rows_, cols = rows ? values.size() / rows : 0;
      out[name.c_str()] = nb::ndarray<nb::numpy, int32_t>(data, {rows, cols}, owner);
    }
    return out;
  }

 private:
  RequestState& request(int64_t rid) {
    auto it = requests_.find(rid);
    DSV41RT_CHECK_CODE(kNotFound, it != requests_.end(), "unknown request ", rid);
    return it->second;
  }

  std::unique_ptr<CpuExecutor> exec_;
  std::map<int64_t, RequestState> requests_;
  int64_t next_id_ = 1;
  size_t last_rows_ = 0;
};

}  // namespace

void register_executor(nb::module_& m) {
  nb::class_<PyExecutor>(m, "Executor", "Eager CPU executor (FP32 reference) of a V4.1 checkpoint.")
      .def(nb::init<const std::string&, nb::object, const std::vector<nb::dict>&, bool, bool>(),
           nb::arg("path"), nb::arg("token_map") = nb::none(),
           nb::arg("engram_layers") = std::vector<nb::dict>{}, nb::arg("cache_quant") = true,
           nb::arg("record_decisions") = false)
      .def("new_request", &PyExecutor::new_request)
      .def("forward", &PyExecutor::forward, nb::arg("request"), nb::arg("tokens"),
           nb::arg("all_logits") = true)
      .def("release", &PyExecutor::release, nb::arg("request"))
      .def("length", &PyExecutor::length, nb::arg("request"))
      .def("counters", &PyExecutor::counters)
      .def("reset_counters", &PyExecutor::reset_counters)
      .def("set_dequant_reuse", &PyExecutor::set_dequant_reuse, nb::arg("on"))
      .def("decisions", &PyExecutor::decisions);
}

}  // namespace dsv41rt::bindings
