// dsv41rt._core.DSparkDrafter: the DSpark drafter forward (runtime/model/drafter.h) on the CPU
// or a CUDA backend, one block per call: numpy in (features, ids, previous tokens), numpy out
// (logits, confidence). The oracle test drives it against NeMo's DeepseekV41DSparkModel.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "bindings/numpy_io.h"
#include "core/status.h"
#include "dsv41rt/runtime.hpp"
#include "runtime/model/drafter.h"

namespace nb = nanobind;

namespace dsv41rt::bindings {
namespace {

using Tokens = nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

// The drafter and what its last draft() recorded.
struct PyDrafter {
  std::unique_ptr<model::Drafter> drafter;
  std::vector<std::vector<float>> window_kv;  // per stage [rows, head_dim]
};

std::vector<int32_t> token_vector(const Tokens& t) { return {t.data(), t.data() + t.shape(0)}; }

std::tuple<Out<float>, Out<float>> draft(PyDrafter& d, In<float, 2> features, int64_t anchor,
                                         Tokens ids, Tokens previous) {
  model::DraftInputs in;
  in.features = features.data();
  in.context = int64_t(features.shape(0));
  in.width = int64_t(features.shape(1));
  in.anchor = anchor;
  in.ids = token_vector(ids);
  in.previous = token_vector(previous);
  model::DraftOutputs out;
  {
    nb::gil_scoped_release release;
    out = d.drafter->draft(in);
  }
  d.window_kv = std::move(out.window_kv);
  Out<float> logits = new_array<float>({size_t(out.block), size_t(out.vocab)});
  Out<float> confidence = new_array<float>({size_t(out.block)});
  std::memcpy(logits.data(), out.logits.data(), out.logits.size() * sizeof(float));
  std::memcpy(confidence.data(), out.confidence.data(), out.confidence.size() * sizeof(float));
  return {logits, confidence};
}

std::vector<Out<float>> window_kv_inputs(const PyDrafter& d) {
  const size_t D = size_t(d.drafter->plan().config.head_dim);
  std::vector<Out<float>> out;
  for (const std::vector<float>& rows : d.window_kv) {
    Out<float> a = new_array<float>({rows.size() / D, D});
    std::memcpy(a.data(), rows.data(), rows.size() * sizeof(float));
    out.push_back(a);
  }
  return out;
}

}  // namespace

void register_draft(nb::module_& m) {
  nb::class_<PyDrafter>(m, "DSparkDrafter",
                        "The DSpark drafter (V4.1 speculative stages mtp.*) of a checkpoint on the "
                        "CPU or a CUDA backend: one parallel block per draft() call.")
      .def(
          "__init__",
          [](PyDrafter* self, const std::string& checkpoint, KvCacheDtype kv_cache_dtype,
             bool record_window_kv, const std::string& device) {
            new (self) PyDrafter{std::make_unique<model::Drafter>(
                                     checkpoint, kv_cache_dtype == KvCacheDtype::kAuto, device),
                                 {}};
            self->drafter->record_window_kv(record_window_kv);
          },
          nb::arg("checkpoint"), nb::arg("kv_cache_dtype") = KvCacheDtype::kAuto,
          nb::arg("record_window_kv") = false, nb::arg("device") = "cpu",
          "Loads the checkpoint's weights with their drafts on `device` ('cpu', 'cuda' or "
          "'cuda:N'). kv_cache_dtype auto: the ring and block keys are FP8-QDQ'd as the window "
          "cache's rows; float32: no rounding. record_window_kv: keep each draft's keys before "
          "their QDQ (window_kv_inputs()).")
      .def("draft", &draft, nb::arg("features"), nb::arg("anchor"), nb::arg("ids"),
           nb::arg("previous"),
           "Drafts one block. features float32 [context, T * hidden]: row i is target position "
           "i's features (the dspark_target_layer_ids' in order, concatenated); anchor: the "
           "position of ids[0] (0 <= anchor <= context; the block occupies anchor .. anchor + "
           "block - 1 and reads the features of [anchor - sliding_window, anchor)); ids int32 "
           "[block]: the anchor token then noise tokens; previous int32 [block]: each row's "
           "preceding token for the Markov head. Returns (logits float32 [block, vocab], "
           "confidence float32 [block]).")
      .def("window_kv_inputs", &window_kv_inputs,
           "Per stage, the last draft's keys entering their FP8 QDQ, float32 [ring + block, "
           "head_dim] (ring rows, then block rows); empty unless record_window_kv.");
}

}  // namespace dsv41rt::bindings
