// dsv41rt._core.model_plan: the C++ config parser and layer plan, exposed for the Python
// cross-check (tests/python/test_cpp_plan_matches_python.py) and for tools.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <string>
#include <vector>

#include "runtime/model/layer_plan.h"
#include "runtime/model/model_config.h"

namespace nb = nanobind;

namespace dsv41rt::bindings {
namespace {

nb::object source_or_none(int layer) {
  if (layer < 0) return nb::none();
  return nb::int_(layer);
}

nb::list layer_dicts(const std::vector<LayerPlan>& layers) {
  nb::list out;
  for (const LayerPlan& l : layers) {
    nb::dict d;
    d["index"] = l.index;
    d["draft"] = l.draft;
    d["name_prefix"] = l.name_prefix();
    d["ratio"] = l.ratio;
    d["role"] = layer_role_name(l.role);
    d["kv_source"] = source_or_none(l.kv_source);
    d["topk_source"] = source_or_none(l.topk_source);
    d["candidates"] = candidate_role_name(l.candidates);
    d["engram"] = l.engram;
    d["rope_base"] = l.rope_base;
    d["yarn"] = l.yarn;
    d["hash_routed"] = l.hash_routed;
    d["n_experts"] = l.n_experts;
    d["experts_per_tok"] = l.experts_per_tok;
    out.append(d);
  }
  return out;
}

nb::dict model_plan(const std::string& path) {
  const ModelPlan plan = build_model_plan(load_model_config(path));
  const ModelConfig& c = plan.config;
  nb::dict out;
  out["arch"] = arch_name(c.arch);
  out["source"] = c.source;
  out["hidden_size"] = c.hidden_size;
  out["vocab_size"] = c.vocab_size;
  out["num_hidden_layers"] = c.num_hidden_layers;
  out["num_nextn_predict_layers"] = c.num_nextn_predict_layers;
  out["sliding_window"] = c.sliding_window;
  out["quantized"] = c.quantized;
  out["weight_block_size"] = nb::make_tuple(c.weight_block_rows, c.weight_block_cols);
  out["expert_fp4"] = c.expert_fp4;
  out["layers"] = layer_dicts(plan.layers);
  out["draft_layers"] = layer_dicts(plan.draft_layers);
  return out;
}

}  // namespace

void register_model_config(nb::module_& m) {
  m.def("model_plan", &model_plan, nb::arg("path"),
        "Parse <path>/config.json (or the file) with the C++ parser and return its per-layer plan "
        "as a dict: arch, layers, draft_layers (dicts with index, ratio, role, kv_source, "
        "topk_source, candidates, engram, rope_base, yarn, hash_routed, n_experts, "
        "experts_per_tok, ...) and a few config scalars. Raises Error naming the file and field.");
}

}  // namespace dsv41rt::bindings
