// dsv41rt._core: the config parser/validator and the layer plan (cpp/runtime/model/), bound for
// python/dsv41rt/config, which fills its frozen dataclasses from what these return. The C++
// objects (_core.ModelConfig, _core.ModelPlan) travel inside those dataclasses so the plan, tensor
// spec and cache bytes are computed from exactly what was parsed.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <climits>
#include <string>
#include <vector>

#include "bindings/python_errors.h"
#include "core/json.h"
#include "runtime/model/engram_layout.h"
#include "runtime/model/layer_plan.h"
#include "runtime/model/model_config.h"

namespace nb = nanobind;

namespace dsv41rt::bindings {

void register_spec(nb::module_& m);  // spec_bindings.cc

namespace {

// A Python config dict as the Json tree json_parse would give for its json.dumps: bool before int
// (bool is an int subclass), ints beyond int64 become doubles (as in JSON text), and NaN/inf
// stay doubles so the parser reports "must be a finite number" naming the field.
Json json_from_python(nb::handle v, const std::string& path, const std::string& source) {
  PyObject* o = v.ptr();
  if (v.is_none()) return Json();
  if (PyBool_Check(o)) return Json::make_bool(o == Py_True);
  if (PyLong_Check(o)) {
    int overflow = 0;
    const long long x = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow == 0) return Json::make_int(x);
    return Json::make_double(overflow > 0 ? HUGE_VAL : -HUGE_VAL);
  }
  if (PyFloat_Check(o)) return Json::make_double(PyFloat_AsDouble(o));
  if (PyUnicode_Check(o)) return Json::make_string(nb::cast<std::string>(v));
  const std::string where = path.empty() ? "config" : path;
  if (PyDict_Check(o)) {
    Json::Object members;
    for (auto [key, value] : nb::borrow<nb::dict>(v)) {
      if (!PyUnicode_Check(key.ptr())) {
        DSV41RT_CONFIG_ERROR(source, where, " has a key that is not a string: ",
                             nb::cast<std::string>(nb::repr(key)));
      }
      const std::string k = nb::cast<std::string>(key);
      members.emplace_back(k, json_from_python(value, path.empty() ? k : path + "." + k, source));
    }
    return Json::make_object(std::move(members));
  }
  if (PyList_Check(o) || PyTuple_Check(o)) {
    Json::Array items;
    size_t i = 0;
    for (nb::handle item : v) {
      items.push_back(json_from_python(item, where + "[" + std::to_string(i++) + "]", source));
    }
    return Json::make_array(std::move(items));
  }
  DSV41RT_CONFIG_ERROR(source, where, " holds a ", nb::cast<std::string>(nb::type_name(v.type())),
                       ", which is not a JSON value");
}

nb::tuple int_tuple(const std::vector<int>& xs) { return nb::tuple(nb::cast(xs)); }

nb::object int_or_none(int x, bool present) {
  return present ? nb::object(nb::int_(x)) : nb::none();
}

nb::object engram_dict(const ModelConfig& c) {
  if (!c.engram) return nb::none();
  const EngramSpec& e = *c.engram;
  nb::dict d;
  d["layer_ids"] = int_tuple(e.layer_ids);
  d["num_embeddings"] = nb::tuple(nb::cast(e.num_embeddings));
  d["max_ngram_size"] = e.max_ngram_size;
  d["vocab_size"] = e.vocab_size;
  d["n_heads"] = e.n_heads;
  d["head_dim"] = e.head_dim;
  d["pad_token_id"] = e.pad_token_id;
  d["compressed_vocab_size"] = e.compressed_vocab_size;
  return d;
}

nb::object dspark_dict(const ModelConfig& c) {
  if (!c.dspark) return nb::none();
  const DSparkSpec& s = *c.dspark;
  nb::dict d;
  d["num_stages"] = s.num_stages;
  d["block_size"] = s.block_size;
  d["noise_token_id"] = s.noise_token_id;
  d["target_layer_ids"] = int_tuple(s.target_layer_ids);
  d["markov_rank"] = s.markov_rank;
  d["n_routed_experts"] = s.n_routed_experts;
  d["num_experts_per_tok"] = s.num_experts_per_tok;
  return d;
}

nb::object rope_scaling_dict(const ModelConfig& c) {
  if (!c.yarn) return nb::none();
  nb::dict d;
  d["factor"] = c.yarn->factor;
  d["original_max_position_embeddings"] = c.yarn->original_max_position;
  d["beta_fast"] = c.yarn->beta_fast;
  d["beta_slow"] = c.yarn->beta_slow;
  return d;
}

nb::object quant_dict(const ModelConfig& c) {
  if (!c.quantized) return nb::none();
  nb::dict d;
  d["weight_block_size"] = nb::make_tuple(c.weight_block_rows, c.weight_block_cols);
  d["expert_dtype"] = c.expert_fp4 ? nb::object(nb::str("fp4")) : nb::none();
  d["activation_scheme"] = c.activation_scheme;
  return d;
}

// Every field of python/dsv41rt/config/schema.py's ModelConfig, under its name there.
nb::dict config_fields(const ModelConfig& c) {
  nb::dict d;
  d["arch"] = arch_name(c.arch);
  d["vocab_size"] = c.vocab_size;
  d["hidden_size"] = c.hidden_size;
  d["moe_intermediate_size"] = c.moe_intermediate_size;
  d["num_hidden_layers"] = c.num_hidden_layers;
  d["num_attention_heads"] = c.num_attention_heads;
  d["num_key_value_heads"] = c.num_key_value_heads;
  d["head_dim"] = c.head_dim;
  d["qk_rope_head_dim"] = c.qk_rope_head_dim;
  d["q_lora_rank"] = c.q_lora_rank;
  d["o_lora_rank"] = c.o_lora_rank;
  d["o_groups"] = c.o_groups;
  d["n_routed_experts"] = c.n_routed_experts;
  d["n_shared_experts"] = c.n_shared_experts;
  d["num_experts_per_tok"] = c.num_experts_per_tok;
  d["scoring_func"] = c.scoring_func;
  d["topk_method"] = c.topk_method;
  d["norm_topk_prob"] = c.norm_topk_prob;
  d["routed_scaling_factor"] = c.routed_scaling_factor;
  d["swiglu_limit"] = c.swiglu_limit;
  d["rms_norm_eps"] = c.rms_norm_eps;
  d["sliding_window"] = c.sliding_window;
  d["compress_ratios"] = int_tuple(c.compress_ratios);
  d["rope_theta"] = c.rope_theta;
  d["compress_rope_theta"] = c.compress_rope_theta;
  d["rope_scaling"] = rope_scaling_dict(c);
  d["max_position_embeddings"] = c.max_position_embeddings;
  d["index_n_heads"] = c.index_n_heads;
  d["index_head_dim"] = c.index_head_dim;
  d["index_topk"] = c.index_topk;
  d["hc_mult"] = c.hc_mult;
  d["hc_sinkhorn_iters"] = c.hc_sinkhorn_iters;
  d["hc_eps"] = c.hc_eps;
  d["num_nextn_predict_layers"] = c.num_nextn_predict_layers;
  d["bos_token_id"] = c.bos_token_id;
  d["eos_token_id"] = c.eos_token_id;
  d["pad_token_id"] = int_or_none(c.pad_token_id.value_or(0), c.pad_token_id.has_value());
  d["quant"] = quant_dict(c);
  d["kv_source_layer_ids"] = int_tuple(c.kv_source_layer_ids);
  d["index_source_layer_ids"] = int_tuple(c.index_source_layer_ids);
  d["candidate_source_layer_id"] = c.candidate_source_layer_id;
  d["candidate_topk_blocks"] = c.candidate_topk_blocks;
  d["candidate_block_size"] = c.candidate_block_size;
  d["engram"] = engram_dict(c);
  d["dspark"] = dspark_dict(c);
  d["num_hash_layers"] = c.num_hash_layers;
  d["source"] = c.source;
  return d;
}

// Every field of python/dsv41rt/config/plan.py's LayerPlan, under its name there.
nb::list layer_dicts(const std::vector<LayerPlan>& layers) {
  nb::list out;
  for (const LayerPlan& l : layers) {
    nb::dict d;
    d["index"] = l.index;
    d["stage"] = layer_stage_name(l.stage);
    d["ratio"] = l.ratio;
    d["role"] = layer_role_name(l.role);
    d["kv_source"] = int_or_none(l.kv_source, l.kv_source >= 0);
    d["topk_source"] = int_or_none(l.topk_source, l.topk_source >= 0);
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

nb::list layout_dicts(const std::vector<EngramLayerLayout>& layouts) {
  nb::list out;
  for (const EngramLayerLayout& l : layouts) {
    nb::dict d;
    d["layer_id"] = l.layer_id;
    d["primes"] = nb::tuple(nb::cast(l.primes));
    d["offsets"] = nb::tuple(nb::cast(l.offsets));
    d["required_rows"] = l.required_rows;
    out.append(d);
  }
  return out;
}

// copy.copy / copy.deepcopy of the frozen dataclasses holding these objects.
template <typename T>
void copyable(nb::class_<T>& cls) {
  cls.def("__copy__", [](const T& self) { return T(self); });
  cls.def(
      "__deepcopy__", [](const T& self, nb::handle) { return T(self); }, nb::arg("memo"));
}

}  // namespace

void register_model_config(nb::module_& m) {
  nb::class_<ModelConfig> config(m, "ModelConfig",
                                 "A parsed and validated config.json (see model_config.h); "
                                 "fields() gives its values for dsv41rt.config.ModelConfig.");
  config.def_ro("source", &ModelConfig::source)
      .def("fields", &config_fields, "Every field under its name in dsv41rt.config.ModelConfig.");
  copyable(config);
  m.def(
      "model_config_from_object",
      [](nb::handle data, const std::string& source) {
        return config_errors_as_python(
            [&] { return model_config_from_json(json_from_python(data, "", source), source); });
      },
      nb::arg("data"), nb::arg("source"),
      "Parse and validate a config.json dict; raises dsv41rt.errors.ConfigError naming the "
      "source and field.");
  m.def(
      "load_model_config",
      [](const std::string& path) {
        return config_errors_as_python([&] { return load_model_config(path); });
      },
      nb::arg("path"),
      "Parse and validate <path>/config.json (or the file); raises ConfigError naming the file "
      "and field.");

  nb::class_<ModelPlan> plan(m, "ModelPlan", "The per-layer plan of a config (layer_plan.h).");
  plan.def_ro("config", &ModelPlan::config)
      .def("layers", [](const ModelPlan& p) { return layer_dicts(p.layers); })
      .def("draft_layers", [](const ModelPlan& p) { return layer_dicts(p.draft_layers); });
  copyable(plan);
  m.def(
      "build_model_plan",
      [](const ModelConfig& c) {
        return config_errors_as_python([&] { return build_model_plan(c); });
      },
      nb::arg("config"), "The per-layer plan (roles, sources, rope) of a parsed config.");

  m.def(
      "engram_layouts",
      [](const std::vector<int>& layer_ids, int max_ngram_size, int64_t vocab_size, int n_heads) {
        EngramSpec e;
        e.layer_ids = layer_ids;
        e.max_ngram_size = max_ngram_size;
        e.vocab_size = vocab_size;
        e.n_heads = n_heads;
        return layout_dicts(engram_layouts(e));
      },
      nb::arg("layer_ids"), nb::arg("max_ngram_size"), nb::arg("vocab_size"), nb::arg("n_heads"),
      "Engram hash buckets per layer: dicts of layer_id, primes, offsets, required_rows.");
  register_spec(m);
}

}  // namespace dsv41rt::bindings
