// Reading config.json into a ModelConfig; the rules are in model_config_rules.cc.
#include "runtime/model/model_config.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <utility>

#include "runtime/model/config_fields.h"

namespace dsv41rt {
namespace {

namespace fs = std::filesystem;
using config::Fields;

std::optional<YarnConfig> parse_rope_scaling(const Fields& f) {
  const std::optional<Fields> rs = f.sub("rope_scaling", false);
  if (!rs) return std::nullopt;
  // V4.1 writes rope_type, the V4 release `type`.
  const Json* kind = rs->get("rope_type");
  if (kind == nullptr) kind = rs->get("type");
  if (kind == nullptr || !kind->is_string() || kind->as_string() != "yarn") {
    DSV41RT_CONFIG_ERROR(f.source(), rs->prefix(), ".rope_type must be 'yarn', got ",
                         kind == nullptr ? std::string("nothing") : config::json_text(*kind));
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
    DSV41RT_CONFIG_ERROR(top.source(), "quantization_config.quant_method must be 'fp8', got ",
                         config::json_text(*q->get("quant_method")));
  }
  const std::string scale_fmt = q->str("scale_fmt", "ue8m0");
  if (scale_fmt != "ue8m0") {
    DSV41RT_CONFIG_ERROR(top.source(), "quantization_config.scale_fmt must be 'ue8m0', got ",
                         config::json_text(*q->get("scale_fmt")));
  }
  const std::vector<int64_t> block = q->ints64("weight_block_size");
  if (block.size() != 2 || std::min(block[0], block[1]) <= 0 ||
      std::max(block[0], block[1]) > std::numeric_limits<int>::max()) {
    DSV41RT_CONFIG_ERROR(top.source(),
                         "quantization_config.weight_block_size must be two positive integers, "
                         "got ",
                         config::json_text(*q->get("weight_block_size")));
  }
  // V4.1 keeps expert_dtype inside quantization_config, the V4 release at top level.
  const Json* expert = q->get("expert_dtype");
  if (expert == nullptr) expert = top.get("expert_dtype");
  if (expert == nullptr) expert = text.get("expert_dtype");
  const bool is_null = expert == nullptr || expert->is_null();
  const bool is_known = !is_null && expert->is_string() &&
                        (expert->as_string() == "fp4" || expert->as_string() == "fp8");
  if (!is_null && !is_known) {
    DSV41RT_CONFIG_ERROR(top.source(), "expert_dtype must be 'fp4' or 'fp8', got ",
                         config::json_text(*expert));
  }
  cfg.activation_scheme = q->str("activation_scheme", "dynamic");
  cfg.quantized = true;
  cfg.weight_block_rows = static_cast<int>(block[0]);
  cfg.weight_block_cols = static_cast<int>(block[1]);
  cfg.expert_fp4 = is_known && expert->as_string() == "fp4";
}

// The fields V4.1's text_config and V4's flat config share, in reading order (the first error
// reported is the first bad field in this order).
void parse_common(const Fields& t, ModelConfig& c) {
  c.vocab_size = t.int64("vocab_size", std::nullopt, 1);
  c.hidden_size = t.int64("hidden_size", std::nullopt, 1);
  c.moe_intermediate_size = t.int64("moe_intermediate_size", std::nullopt, 1);
  c.num_hidden_layers = t.int32("num_hidden_layers", std::nullopt, 1);
  c.num_attention_heads = t.int32("num_attention_heads", std::nullopt, 1);
  c.num_key_value_heads = t.int64("num_key_value_heads", 1);
  c.head_dim = t.int32("head_dim", std::nullopt, 1);
  c.qk_rope_head_dim = t.int32("qk_rope_head_dim", std::nullopt, 1);
  c.q_lora_rank = t.int32("q_lora_rank", std::nullopt, 1);
  c.o_lora_rank = t.int32("o_lora_rank", std::nullopt, 1);
  c.o_groups = t.int32("o_groups", std::nullopt, 1);
  c.n_routed_experts = t.int32("n_routed_experts", std::nullopt, 1);
  c.n_shared_experts = t.int64("n_shared_experts", 1);
  c.num_experts_per_tok = t.int32("num_experts_per_tok", std::nullopt, 1);
  c.scoring_func = t.str("scoring_func", "sqrtsoftplus");
  c.topk_method = t.str("topk_method", "noaux_tc");
  c.norm_topk_prob = t.boolean("norm_topk_prob", true);
  c.routed_scaling_factor = t.number("routed_scaling_factor", std::nullopt, true);
  c.swiglu_limit = t.number("swiglu_limit", 10.0, true);
  c.sliding_window = t.int32("sliding_window", std::nullopt, 1);
  c.compress_ratios = t.ints("compress_ratios");
  c.rope_theta = t.number("rope_theta", 10000.0, true);
  c.compress_rope_theta = t.number("compress_rope_theta", 160000.0, true);
  c.yarn = parse_rope_scaling(t);
  c.max_position_embeddings = t.int64("max_position_embeddings", 1048576, 1);
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
  c.pad_token_id = pick("pad_token_id", std::nullopt);
  if (!bos || !eos) {
    DSV41RT_CONFIG_ERROR(top.source(), "bos_token_id and eos_token_id must be integers");
  }
  c.bos_token_id = *bos;
  c.eos_token_id = *eos;
}

std::optional<EngramSpec> parse_engram(const Fields& t) {
  const std::vector<int> ids = t.ints("engram_layer_ids", false);
  if (ids.empty()) return std::nullopt;
  EngramSpec e;
  e.layer_ids = ids;
  e.num_embeddings = t.ints64("engram_num_embeddings");
  e.max_ngram_size = t.int32("engram_max_ngram_size", 4, 2);
  e.vocab_size = t.int64("engram_vocab_size", std::nullopt, 2);
  e.n_heads = t.int32("engram_n_heads", std::nullopt, 1);
  e.head_dim = t.int32("engram_head_dim", std::nullopt, 1);
  e.pad_token_id = t.int32("engram_pad_token_id", 2, 0);
  e.compressed_vocab_size = t.int64("engram_compressed_vocab_size", std::nullopt, 1);
  return e;
}

std::optional<DSparkSpec> parse_dspark(const Fields& t, int num_stages) {
  if (num_stages == 0) return std::nullopt;
  DSparkSpec d;
  d.num_stages = num_stages;
  d.block_size = t.int32("dspark_block_size", std::nullopt, 1);
  d.noise_token_id = t.int32("dspark_noise_token_id", std::nullopt, 0);
  d.target_layer_ids = t.ints("dspark_target_layer_ids");
  d.markov_rank = t.int32("dspark_markov_rank", std::nullopt, 1);
  d.n_routed_experts = t.int32("dspark_n_routed_experts", std::nullopt, 1);
  d.num_experts_per_tok = t.int32("dspark_num_experts_per_tok", std::nullopt, 1);
  return d;
}

void parse_v41(const Fields& top, ModelConfig& c) {
  // A null text_config is reported like any other non-object.
  const Fields t(*top.raw("text_config", true), "text_config", top.source());
  parse_common(t, c);
  c.rms_norm_eps = t.number("rms_norm_eps", 1e-20, true);
  c.engram = parse_engram(t);
  c.dspark = parse_dspark(t, c.num_nextn_predict_layers);
  parse_token_ids(top, t, c);
  parse_quant(top, t, c);
  c.kv_source_layer_ids = t.ints("kv_source_layer_ids");
  c.index_source_layer_ids = t.ints("index_source_layer_ids");
  c.candidate_source_layer_id = t.int32("candidate_source_layer_id", -1, -1);
  c.candidate_topk_blocks = t.int32("candidate_topk_blocks", 0, 0);
  c.candidate_block_size = t.int32("candidate_block_size", 0, 0);
}

void parse_v4(const Fields& top, ModelConfig& c) {
  parse_common(top, c);
  c.rms_norm_eps = top.number("rms_norm_eps", 1e-6, true);
  parse_token_ids(top, top, c);
  parse_quant(top, top, c);
  c.num_hash_layers = top.int32("num_hash_layers", 0, 0);
}

}  // namespace

const char* arch_name(Arch arch) noexcept {
  return arch == Arch::kV41 ? "deepseek_v41" : "deepseek_v4";
}

ModelConfig model_config_from_json(const Json& root, const std::string& source) {
  const Fields top(root, "", source);
  ModelConfig cfg;
  cfg.source = source;
  const std::string model_type = top.str("model_type");
  if (model_type == arch_name(Arch::kV41)) {
    cfg.arch = Arch::kV41;
    parse_v41(top, cfg);
  } else if (model_type == arch_name(Arch::kV4)) {
    cfg.arch = Arch::kV4;
    parse_v4(top, cfg);
  } else {
    DSV41RT_CONFIG_ERROR(source, "model_type must be 'deepseek_v41' or 'deepseek_v4', got ",
                         config::json_text(*top.get("model_type")));
  }
  validate_model_config(cfg);
  return cfg;
}

ModelConfig parse_model_config_json(std::string_view json_text, const std::string& source) {
  Json root;
  try {
    root = json_parse(json_text);
  } catch (const Error& e) {
    DSV41RT_CONFIG_ERROR(source, "not valid JSON: ", e.message());
  }
  return model_config_from_json(root, source);
}

ModelConfig load_model_config(const std::string& checkpoint_dir_or_file) {
  std::error_code ec;
  const std::string file = fs::is_directory(checkpoint_dir_or_file, ec)
                               ? (fs::path(checkpoint_dir_or_file) / "config.json").string()
                               : checkpoint_dir_or_file;
  std::ifstream in(file, std::ios::binary);
  if (!in || fs::is_directory(file, ec)) {
    throw ConfigError(StatusCode::kNotFound, __FILE__, __LINE__, file + ": no config.json found");
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) DSV41RT_CONFIG_ERROR(file, "read failed");
  return parse_model_config_json(text.str(), file);
}

}  // namespace dsv41rt
