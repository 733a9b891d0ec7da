// Mirrors python/dsv41rt/config/parse.py and validate.py; keep the three in step (the Python side
// is the source of truth, tests/python/test_cpp_plan_matches_python.py guards the drift).
#include "runtime/model/model_config.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <utility>

#include "core/enum_names.h"
#include "core/json.h"
#include "core/status.h"

namespace dsv41rt {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kIntMax = std::numeric_limits<int>::max();

// Python's type names, so messages read like the Python parser's.
const char* py_type_name(const Json& v) {
  static constexpr const char* kNames[] = {"NoneType", "bool", "int", "float",
                                           "str",      "list", "dict"};
  return enum_name(v.type(), kNames, "?");
}

std::string py_double(double d) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), d);
  std::string s(buf, ec == std::errc() ? end : buf);
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

// A Python-repr-like rendering of a JSON value for "got ..." in messages.
std::string py_repr(const Json& v) {
  switch (v.type()) {
    case Json::Type::kNull:
      return "None";
    case Json::Type::kBool:
      return v.as_bool() ? "True" : "False";
    case Json::Type::kInt:
      return std::to_string(v.as_int());
    case Json::Type::kDouble:
      return py_double(v.as_double());
    case Json::Type::kString:
      return "'" + v.as_string() + "'";
    case Json::Type::kArray: {
      std::string out = "[";
      for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + py_repr(v.at(i));
      return out + "]";
    }
    case Json::Type::kObject: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, x] : v.as_object()) {
        out += (first ? "'" : ", '") + k + "': " + py_repr(x);
        first = false;
      }
      return out + "}";
    }
  }
  return "?";
}

template <typename T>
std::string py_list(const std::vector<T>& xs) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < xs.size(); ++i) os << (i ? ", " : "") << xs[i];
  os << "]";
  return os.str();
}

// Typed accessor over one JSON object that names `prefix.key` in every error (parse.py _Fields).
class Fields {
 public:
  Fields(const Json& data, std::string prefix, const std::string& source)
      : data_(&data), prefix_(std::move(prefix)), source_(&source) {
    if (!data.is_object()) {
      DSV41RT_THROW(source, ": ", prefix_.empty() ? "config" : prefix_,
                    " must be a JSON object, got ", py_type_name(data));
    }
  }

  const Json& data() const { return *data_; }
  const std::string& prefix() const { return prefix_; }
  const std::string& source() const { return *source_; }
  bool has(std::string_view key) const { return data_->find(key) != nullptr; }
  const Json* get(std::string_view key) const { return data_->find(key); }

  std::string name(std::string_view key) const {
    return prefix_.empty() ? std::string(key) : prefix_ + "." + std::string(key);
  }

  [[noreturn]] void fail(std::string_view key, const std::string& what, const Json& v) const {
    DSV41RT_THROW(source(), ": ", name(key), " must be ", what, ", got ", py_repr(v));
  }

  // The value, or nullptr when absent and optional; throws when absent and required.
  const Json* raw(std::string_view key, bool required) const {
    const Json* v = data_->find(key);
    if (v == nullptr && required) {
      DSV41RT_THROW(source(), ": required field ", name(key), " is missing");
    }
    return v;
  }

  int64_t int64(std::string_view key, std::optional<int64_t> def = std::nullopt,
                std::optional<int64_t> minimum = std::nullopt,
                int64_t maximum = std::numeric_limits<int64_t>::max()) const {
    const Json* v = raw(key, !def.has_value());
    if (v == nullptr) return *def;
    if (!v->is_int()) fail(key, "an integer", *v);
    const int64_t x = v->as_int();
    if (minimum && x < *minimum) fail(key, "an integer >= " + std::to_string(*minimum), *v);
    if (x > maximum) fail(key, "an integer <= " + std::to_string(maximum), *v);
    return x;
  }

  int int32(std::string_view key, std::optional<int64_t> def = std::nullopt,
            std::optional<int64_t> minimum = std::nullopt) const {
    const int64_t x = int64(key, def, minimum, kIntMax);
    if (x < -kIntMax) fail(key, "a 32-bit integer", *raw(key, true));
    return static_cast<int>(x);
  }

  double number(std::string_view key, std::optional<double> def = std::nullopt,
                bool positive = false) const {
    const Json* v = raw(key, !def.has_value());
    if (v == nullptr) return *def;
    if (!v->is_number() || !std::isfinite(v->as_double())) fail(key, "a finite number", *v);
    const double x = v->as_double();
    if (positive && x <= 0) fail(key, "a positive number", *v);
    return x;
  }

  bool boolean(std::string_view key, std::optional<bool> def = std::nullopt) const {
    const Json* v = raw(key, !def.has_value());
    if (v == nullptr) return *def;
    if (!v->is_bool()) fail(key, "true or false", *v);
    return v->as_bool();
  }

  std::string str(std::string_view key, std::optional<std::string> def = std::nullopt) const {
    const Json* v = raw(key, !def.has_value());
    if (v == nullptr) return *def;
    if (!v->is_string()) fail(key, "a string", *v);
    return v->as_string();
  }

  // A list of integers; absent -> `def` (or an error when `required`).
  std::vector<int64_t> ints64(std::string_view key, bool required = true) const {
    const Json* v = raw(key, required);
    if (v == nullptr) return {};
    bool ok = v->is_array();
    if (ok) {
      for (const Json& x : v->as_array()) ok = ok && x.is_int();
    }
    if (!ok) fail(key, "a list of integers", *v);
    std::vector<int64_t> out;
    for (const Json& x : v->as_array()) out.push_back(x.as_int());
    return out;
  }

  std::vector<int> ints(std::string_view key, bool required = true) const {
    const Json* v = raw(key, required);
    std::vector<int> out;
    for (int64_t x : ints64(key, required)) {
      if (x < -kIntMax || x > kIntMax) fail(key, "a list of 32-bit integers", *v);
      out.push_back(static_cast<int>(x));
    }
    return out;
  }

  // Nested object; nullopt when absent (optional) or null.
  std::optional<Fields> sub(std::string_view key, bool required) const {
    const Json* v = raw(key, required);
    if (v == nullptr || v->is_null()) return std::nullopt;
    return Fields(*v, name(key), source());
  }

 private:
  const Json* data_;
  std::string prefix_;
  const std::string* source_;
};

// Fields validate.py checks that the C++ ModelConfig does not carry.
struct Extras {
  int64_t num_key_value_heads = 1;
  int64_t n_shared_experts = 1;
  std::string scoring_func;
  std::string topk_method;
};

std::optional<YarnConfig> parse_rope_scaling(const Fields& f) {
  const std::optional<Fields> rs = f.sub("rope_scaling", false);
  if (!rs) return std::nullopt;
  // V4.1 writes rope_type, the V4 release `type`.
  const Json* kind = rs->get("rope_type");
  if (kind == nullptr) kind = rs->get("type");
  if (kind == nullptr || !kind->is_string() || kind->as_string() != "yarn") {
    DSV41RT_THROW(f.source(), ": ", rs->prefix(), ".rope_type must be 'yarn', got ",
                  kind == nullptr ? std::string("None") : py_repr(*kind));
  }
  YarnConfig y;
  y.factor = rs->number("factor", std::nullopt, true);
  y.original_max_position = rs->int64("original_max_position_embeddings", std::nullopt, 1);
  y.beta_fast = rs->number("beta_fast", std::nullopt, true);
  y.beta_slow = rs->number("beta_slow", std::nullopt, true);
  return y;
}

void parse_quant(const Fields& top, const Fields& text, ModelConfig& cfg) {
  // Release block shape and FP4 experts when the weights are stored unquantised.
  cfg.quantized = false;
  cfg.weight_block_rows = cfg.weight_block_cols = cfg.is_v41() ? 32 : 128;
  cfg.expert_fp4 = true;
  const std::optional<Fields> q = top.sub("quantization_config", false);
  if (!q) return;
  const std::string method = q->str("quant_method");
  if (method != "fp8") {
    DSV41RT_THROW(top.source(), ": quantization_config.quant_method must be 'fp8', got '", method,
                  "'");
  }
  const std::string scale_fmt = q->str("scale_fmt", "ue8m0");
  if (scale_fmt != "ue8m0") {
    DSV41RT_THROW(top.source(), ": quantization_config.scale_fmt must be 'ue8m0', got '", scale_fmt,
                  "'");
  }
  const std::vector<int64_t> block = q->ints64("weight_block_size");
  if (block.size() != 2 || std::min(block[0], block[1]) <= 0 ||
      std::max(block[0], block[1]) > kIntMax) {
    DSV41RT_THROW(top.source(),
                  ": quantization_config.weight_block_size must be two positive integers, got ",
                  py_list(block));
  }
  // V4.1 keeps expert_dtype inside quantization_config, the V4 release at top level.
  const Json* expert = q->get("expert_dtype");
  if (expert == nullptr) expert = top.get("expert_dtype");
  if (expert == nullptr) expert = text.get("expert_dtype");
  const bool is_null = expert == nullptr || expert->is_null();
  const bool is_known = !is_null && expert->is_string() &&
                        (expert->as_string() == "fp4" || expert->as_string() == "fp8");
  if (!is_null && !is_known) {
    DSV41RT_THROW(top.source(), ": expert_dtype must be 'fp4' or 'fp8', got ", py_repr(*expert));
  }
  q->str("activation_scheme", "dynamic");
  cfg.quantized = true;
  cfg.weight_block_rows = static_cast<int>(block[0]);
  cfg.weight_block_cols = static_cast<int>(block[1]);
  cfg.expert_fp4 = is_known && expert->as_string() == "fp4";
}

// parse.py _common, in the same order (so the first error reported is the same).
void parse_common(const Fields& t, ModelConfig& c, Extras& x) {
  c.vocab_size = t.int64("vocab_size", std::nullopt, 1);
  c.hidden_size = t.int64("hidden_size", std::nullopt, 1);
  c.moe_intermediate_size = t.int64("moe_intermediate_size", std::nullopt, 1);
  c.num_hidden_layers = t.int32("num_hidden_layers", std::nullopt, 1);
  c.num_attention_heads = t.int32("num_attention_heads", std::nullopt, 1);
  x.num_key_value_heads = t.int64("num_key_value_heads", 1);
  c.head_dim = t.int32("head_dim", std::nullopt, 1);
  c.qk_rope_head_dim = t.int32("qk_rope_head_dim", std::nullopt, 1);
  c.q_lora_rank = t.int32("q_lora_rank", std::nullopt, 1);
  c.o_lora_rank = t.int32("o_lora_rank", std::nullopt, 1);
  c.o_groups = t.int32("o_groups", std::nullopt, 1);
  c.n_routed_experts = t.int32("n_routed_experts", std::nullopt, 1);
  x.n_shared_experts = t.int64("n_shared_experts", 1);
  c.num_experts_per_tok = t.int32("num_experts_per_tok", std::nullopt, 1);
  x.scoring_func = t.str("scoring_func", "sqrtsoftplus");
  x.topk_method = t.str("topk_method", "noaux_tc");
  c.norm_topk_prob = t.boolean("norm_topk_prob", true);
  c.routed_scaling_factor = t.number("routed_scaling_factor", std::nullopt, true);
  c.swiglu_limit = t.number("swiglu_limit", 10.0, true);
  c.sliding_window = t.int32("sliding_window", std::nullopt, 1);
  c.compress_ratios = t.ints("compress_ratios");
  c.rope_theta = t.number("rope_theta", 10000.0, true);
  c.compress_rope_theta = t.number("compress_rope_theta", 160000.0, true);
  c.yarn = parse_rope_scaling(t);
  t.int64("max_position_embeddings", 1048576, 1);
  c.index_n_heads = t.int32("index_n_heads", std::nullopt, 1);
  c.index_head_dim = t.int32("index_head_dim", std::nullopt, 1);
  c.index_topk = t.int32("index_topk", std::nullopt, 1);
  c.hc_mult = t.int32("hc_mult", 4, 1);
  c.hc_sinkhorn_iters = t.int32("hc_sinkhorn_iters", 20, 1);
  c.hc_eps = t.number("hc_eps", 1e-6, true);
  c.num_nextn_predict_layers = t.int32("num_nextn_predict_layers", 0, 0);
}

// Token ids may sit at top level or in text_config (top level wins); null bos/eos is an error.
void parse_token_ids(const Fields& top, const Fields& t, ModelConfig& c) {
  auto pick = [&](std::string_view key, std::optional<int> def) -> std::optional<int> {
    const Fields& src = top.has(key) ? top : t;
    if (!src.has(key)) return def;
    if (src.get(key)->is_null()) return std::nullopt;
    return src.int32(key);
  };
  const std::optional<int> bos = pick("bos_token_id", 0), eos = pick("eos_token_id", 1);
  pick("pad_token_id", std::nullopt);
  if (!bos || !eos) {
    DSV41RT_THROW(top.source(), ": bos_token_id and eos_token_id must be integers");
  }
  c.bos_token_id = *bos;
  c.eos_token_id = *eos;
}

void parse_v41(const Fields& top, ModelConfig& c, Extras& x) {
  // A null text_config is reported like any other non-object.
  const Fields t(*top.raw("text_config", true), "text_config", top.source());
  parse_common(t, c, x);
  c.rms_norm_eps = t.number("rms_norm_eps", 1e-20, true);
  const std::vector<int> engram_ids = t.ints("engram_layer_ids", false);
  if (!engram_ids.empty()) {
    EngramSpec e;
    e.layer_ids = engram_ids;
    e.num_embeddings = t.ints64("engram_num_embeddings");
    e.max_ngram_size = t.int32("engram_max_ngram_size", 4, 2);
    e.vocab_size = t.int64("engram_vocab_size", std::nullopt, 2);
    e.n_heads = t.int32("engram_n_heads", std::nullopt, 1);
    e.head_dim = t.int32("engram_head_dim", std::nullopt, 1);
    e.pad_token_id = t.int32("engram_pad_token_id", 2, 0);
    e.compressed_vocab_size = t.int64("engram_compressed_vocab_size", std::nullopt, 1);
    c.engram = std::move(e);
  }
  if (c.num_nextn_predict_layers > 0) {
    DSparkSpec d;
    d.num_stages = c.num_nextn_predict_layers;
    d.block_size = t.int32("dspark_block_size", std::nullopt, 1);
    d.noise_token_id = t.int32("dspark_noise_token_id", std::nullopt, 0);
    d.target_layer_ids = t.ints("dspark_target_layer_ids");
    d.markov_rank = t.int32("dspark_markov_rank", std::nullopt, 1);
    d.n_routed_experts = t.int32("dspark_n_routed_experts", std::nullopt, 1);
    d.num_experts_per_tok = t.int32("dspark_num_experts_per_tok", std::nullopt, 1);
    c.dspark = std::move(d);
  }
  parse_token_ids(top, t, c);
  parse_quant(top, t, c);
  c.kv_source_layer_ids = t.ints("kv_source_layer_ids");
  c.index_source_layer_ids = t.ints("index_source_layer_ids");
  c.candidate_source_layer_id = t.int32("candidate_source_layer_id", -1, -1);
  c.candidate_topk_blocks = t.int32("candidate_topk_blocks", 0, 0);
  c.candidate_block_size = t.int32("candidate_block_size", 0, 0);
}

void parse_v4(const Fields& top, ModelConfig& c, Extras& x) {
  parse_common(top, c, x);
  c.rms_norm_eps = top.number("rms_norm_eps", 1e-6, true);
  parse_token_ids(top, top, c);
  parse_quant(top, top, c);
  c.num_hash_layers = top.int32("num_hash_layers", 0, 0);
}

// ---- validate.py ----------------------------------------------------------------------------

bool contains(const std::vector<int>& xs, int x) {
  return std::find(xs.begin(), xs.end(), x) != xs.end();
}

void check_layer_list(const ModelConfig& c, const char* name, const std::vector<int>& ids,
                      int limit) {
  std::vector<int> sorted(ids);
  std::sort(sorted.begin(), sorted.end());
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  if (sorted != ids) {
    DSV41RT_THROW(c.source, ": ", name, " must be strictly increasing, got ", py_list(ids));
  }
  std::vector<int> bad;
  for (int i : ids) {
    if (i < 0 || i >= limit) bad.push_back(i);
  }
  if (!bad.empty()) {
    DSV41RT_THROW(c.source, ": ", name, " refers to layers ", py_list(bad), " outside 0..",
                  limit - 1);
  }
}

void validate_common(const ModelConfig& c, const Extras& x) {
  const std::string& src = c.source;
  if (x.num_key_value_heads != 1) {
    DSV41RT_THROW(src, ": num_key_value_heads must be 1 (one shared KV latent), got ",
                  x.num_key_value_heads);
  }
  if (x.n_shared_experts != 1) {
    DSV41RT_THROW(src, ": n_shared_experts must be 1, got ", x.n_shared_experts);
  }
  if (c.num_attention_heads % c.o_groups) {
    DSV41RT_THROW(src, ": num_attention_heads (", c.num_attention_heads,
                  ") must be divisible by o_groups (", c.o_groups, ")");
  }
  const int r = c.qk_rope_head_dim;
  if (r % 2 || r > std::min(c.head_dim, c.index_head_dim)) {
    DSV41RT_THROW(src, ": qk_rope_head_dim (", r, ") must be even and <= head_dim (", c.head_dim,
                  ") and index_head_dim (", c.index_head_dim, ")");
  }
  if (c.num_experts_per_tok > c.n_routed_experts) {
    DSV41RT_THROW(src, ": num_experts_per_tok (", c.num_experts_per_tok,
                  ") exceeds n_routed_experts (", c.n_routed_experts, ")");
  }
  if (x.scoring_func != "sqrtsoftplus") {
    DSV41RT_THROW(src, ": scoring_func must be 'sqrtsoftplus', got '", x.scoring_func, "'");
  }
  if (x.topk_method != "noaux_tc") {
    DSV41RT_THROW(src, ": topk_method must be 'noaux_tc', got '", x.topk_method, "'");
  }
  // Cache formats quantise head/index vectors in blocks of 32 (FP8 window, MXFP4) and 16 (NVFP4).
  const std::pair<const char*, int64_t> widths[] = {{"head_dim", c.head_dim},
                                                    {"index_head_dim", c.index_head_dim},
                                                    {"hidden_size", c.hidden_size}};
  for (const auto& [name, v] : widths) {
    if (v % 32) {
      DSV41RT_THROW(src, ": ", name, " (", v, ") must be a multiple of 32 (quantiser block)");
    }
  }
  if (c.quantized && c.expert_fp4) {
    const std::pair<const char*, int64_t> expert_widths[] = {
        {"hidden_size", c.hidden_size}, {"moe_intermediate_size", c.moe_intermediate_size}};
    for (const auto& [name, v] : expert_widths) {
      if (v % 32) {
        DSV41RT_THROW(src, ": ", name, " (", v, ") must be a multiple of 32 for FP4 experts");
      }
    }
  }
  const int64_t needed = int64_t{c.num_hidden_layers} + c.num_nextn_predict_layers;
  const int64_t n_ratios = static_cast<int64_t>(c.compress_ratios.size());
  if (n_ratios < needed) {
    DSV41RT_THROW(src, ": compress_ratios has ", n_ratios,
                  " entries but num_hidden_layers + num_nextn_predict_layers = ", needed);
  }
  for (int64_t i = c.num_hidden_layers; i < needed; ++i) {
    if (c.compress_ratios[i] != 0) {
      DSV41RT_THROW(src, ": compress_ratios[", i, "] (draft/MTP stage) must be 0, got ",
                    c.compress_ratios[i]);
    }
  }
  const std::vector<int> allowed =
      c.is_v41() ? std::vector<int>{0, 1, 2} : std::vector<int>{0, 4, 128};
  for (size_t i = 0; i < c.compress_ratios.size(); ++i) {
    if (!contains(allowed, c.compress_ratios[i])) {
      DSV41RT_THROW(src, ": compress_ratios[", i, "] = ", c.compress_ratios[i],
                    " is not supported for ", arch_name(c.arch), " (allowed: ", py_list(allowed),
                    ")");
    }
  }
  bool any_compressed = false;
  for (int i = 0; i < c.num_hidden_layers; ++i) any_compressed |= c.compress_ratios[i] > 0;
  if (any_compressed && !c.yarn) {
    DSV41RT_THROW(src, ": rope_scaling (YaRN) is required when any layer has compress ratio > 0");
  }
}

void validate_v41_schedule(const ModelConfig& c) {
  const int n = c.num_hidden_layers;
  const std::vector<int>&kv = c.kv_source_layer_ids, &idx = c.index_source_layer_ids;
  check_layer_list(c, "kv_source_layer_ids", kv, n);
  check_layer_list(c, "index_source_layer_ids", idx, n);
  std::vector<int> missing;
  for (int s : kv) {
    if (!contains(idx, s)) missing.push_back(s);
  }
  if (!missing.empty()) {
    DSV41RT_THROW(c.source, ": kv_source_layer_ids ", py_list(missing),
                  " must also be in index_source_layer_ids");
  }
  int owner_ratio = -1;  // -1: no KV source yet (Python's None)
  for (int layer = 0; layer < n; ++layer) {
    const int m = c.compress_ratios[layer];
    if (m == 0) {
      if (contains(kv, layer) || contains(idx, layer)) {
        DSV41RT_THROW(c.source, ": layer ", layer,
                      " has compress ratio 0 (SWA-only) and cannot be a KV or index source");
      }
      continue;
    }
    if (contains(kv, layer)) owner_ratio = m;
    if (owner_ratio != m) {
      DSV41RT_THROW(c.source, ": layer ", layer, " (compress ratio ", m,
                    ") needs a preceding KV source with the same ratio (the most recent KV "
                    "source has ratio ",
                    owner_ratio < 0 ? std::string("None") : std::to_string(owner_ratio), ")");
    }
  }
  const int cand = c.candidate_source_layer_id;
  if (cand >= 0) {
    if (!contains(kv, cand)) {
      DSV41RT_THROW(c.source, ": candidate_source_layer_id ", cand,
                    " must be -1 or one of kv_source_layer_ids ", py_list(kv));
    }
    if (c.candidate_block_size <= 0 || c.candidate_topk_blocks <= 0) {
      DSV41RT_THROW(c.source,
                    ": candidate_block_size and candidate_topk_blocks must be positive when "
                    "candidate_source_layer_id is set");
    }
  }
}

bool is_prime(int64_t n) {
  if (n < 2) return false;
  if (n % 2 == 0) return n == 2;
  for (int64_t d = 3; d * d <= n; d += 2) {
    if (n % d == 0) return false;
  }
  return true;
}

void validate_engram(const ModelConfig& c) {
  if (!c.engram) return;
  const EngramSpec& e = *c.engram;
  check_layer_list(c, "engram_layer_ids", e.layer_ids, c.num_hidden_layers);
  if (e.num_embeddings.size() != e.layer_ids.size()) {
    DSV41RT_THROW(c.source, ": engram_num_embeddings has ", e.num_embeddings.size(),
                  " entries for ", e.layer_ids.size(), " engram_layer_ids");
  }
  if (e.pad_token_id < 0 || e.pad_token_id >= c.vocab_size) {
    DSV41RT_THROW(c.source, ": engram_pad_token_id ", e.pad_token_id,
                  " is outside the vocabulary (0..", c.vocab_size - 1, ")");
  }
  if (e.head_dim % 32) {
    DSV41RT_THROW(c.source, ": engram_head_dim (", e.head_dim,
                  ") must be a multiple of 32 (FP8 row block)");
  }
  // engram_layout.py: per layer, per n-gram size, per head, the next prime above vocab_size - 1
  // not used before; a layer's table needs the sum of its primes as rows.
  std::set<int64_t> used;
  for (size_t l = 0; l < e.layer_ids.size(); ++l) {
    std::vector<int64_t> primes;
    for (int n = 0; n < e.max_ngram_size - 1; ++n) {
      int64_t current = e.vocab_size - 1;
      for (int h = 0; h < e.n_heads; ++h) {
        do {
          ++current;
        } while (!is_prime(current) || used.count(current));
        used.insert(current);
        primes.push_back(current);
      }
    }
    int64_t required = 0;
    for (int64_t p : primes) required += p;
    if (e.num_embeddings[l] < required) {
      DSV41RT_THROW(c.source, ": engram_num_embeddings for layer ", e.layer_ids[l], " is ",
                    e.num_embeddings[l], ", but its hash buckets need ", required,
                    " rows (sum of primes ", py_list(primes), ")");
    }
  }
}

void validate_dspark(const ModelConfig& c) {
  if (!c.dspark) return;
  const DSparkSpec& d = *c.dspark;
  check_layer_list(c, "dspark_target_layer_ids", d.target_layer_ids, c.num_hidden_layers);
  if (d.target_layer_ids.empty()) {
    DSV41RT_THROW(c.source,
                  ": dspark_target_layer_ids must not be empty when num_nextn_predict_layers > 0");
  }
  if (d.num_experts_per_tok > d.n_routed_experts) {
    DSV41RT_THROW(c.source, ": dspark_num_experts_per_tok (", d.num_experts_per_tok,
                  ") exceeds dspark_n_routed_experts (", d.n_routed_experts, ")");
  }
  if (d.block_size < 2) {
    DSV41RT_THROW(c.source,
                  ": dspark_block_size must be >= 2 (anchor + at least one draft slot), got ",
                  d.block_size);
  }
  if (d.noise_token_id < 0 || d.noise_token_id >= c.vocab_size) {
    DSV41RT_THROW(c.source, ": dspark_noise_token_id ", d.noise_token_id,
                  " is outside the vocabulary");
  }
}

void validate_v4(const ModelConfig& c) {
  if (c.num_hash_layers > c.num_hidden_layers) {
    DSV41RT_THROW(c.source, ": num_hash_layers (", c.num_hash_layers,
                  ") exceeds num_hidden_layers (", c.num_hidden_layers, ")");
  }
  if (c.num_hash_layers && c.num_experts_per_tok > c.n_routed_experts) {
    DSV41RT_THROW(c.source, ": hash layers need num_experts_per_tok <= n_routed_experts");
  }
}

}  // namespace

const char* arch_name(Arch arch) noexcept {
  return arch == Arch::kV41 ? "deepseek_v41" : "deepseek_v4";
}

ModelConfig parse_model_config_json(std::string_view json_text, const std::string& source) {
  Json root;
  try {
    root = json_parse(json_text);
  } catch (const Error& e) {
    DSV41RT_THROW(source, ": not valid JSON: ", e.message());
  }
  const Fields top(root, "", source);
  ModelConfig cfg;
  cfg.source = source;
  Extras extras;
  const std::string model_type = top.str("model_type");
  if (model_type == "deepseek_v41") {
    cfg.arch = Arch::kV41;
    parse_v41(top, cfg, extras);
  } else if (model_type == "deepseek_v4") {
    cfg.arch = Arch::kV4;
    parse_v4(top, cfg, extras);
  } else {
    DSV41RT_THROW(source, ": model_type must be 'deepseek_v41' or 'deepseek_v4', got '", model_type,
                  "'");
  }
  validate_common(cfg, extras);
  if (cfg.is_v41()) {
    validate_v41_schedule(cfg);
    validate_engram(cfg);
    validate_dspark(cfg);
  } else {
    validate_v4(cfg);
  }
  return cfg;
}

ModelConfig load_model_config(const std::string& checkpoint_dir_or_file) {
  std::error_code ec;
  const std::string file = fs::is_directory(checkpoint_dir_or_file, ec)
                               ? (fs::path(checkpoint_dir_or_file) / "config.json").string()
                               : checkpoint_dir_or_file;
  std::ifstream in(file, std::ios::binary);
  if (!in || fs::is_directory(file, ec)) {
    DSV41RT_THROW_CODE(kNotFound, file, ": no config.json found");
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) DSV41RT_THROW_CODE(kIoError, file, ": read failed");
  return parse_model_config_json(text.str(), file);
}

}  // namespace dsv41rt
