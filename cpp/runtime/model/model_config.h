// DeepSeek-V4.1 / V4 model configs parsed from a Hugging Face `config.json`.
//
// The one parser and validator of config.json: C++ hosts call it directly, Python binds it
// (python/dsv41rt/config/parse.py fills its dataclasses from what it returns). V4.1
// (`model_type: deepseek_v41`) nests the text model under `text_config`, V4 (`deepseek_v4`) is
// flat. Structural fields (widths, layer counts, schedules) are required: a partial config must
// not silently become a different model. Numerics every release shares (eps, Sinkhorn iterations,
// token ids) take the released defaults when absent. Unknown keys are ignored (HF configs carry
// many non-architectural keys), but every key that is read is type-checked.
//
// Every error is a ConfigError whose message starts with the config's source and names the field
// (and the layer, for schedule rules), e.g.
// "/ck/config.json: text_config.hidden_size must be an integer, got \"64\"".
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/export.h"
#include "core/json.h"
#include "core/status.h"

namespace dsv41rt {

// A config.json that cannot be read, is malformed or breaks the model's rules (bindings raise
// Python's dsv41rt.errors.ConfigError for it; C++ callers may catch it as any Error).
class DSV41RT_API ConfigError : public Error {
 public:
  using Error::Error;
};

enum class Arch { kV41, kV4 };

// "deepseek_v41" / "deepseek_v4" (the model_type values).
DSV41RT_API const char* arch_name(Arch arch) noexcept;

// YaRN frequency blend used by every layer with compress ratio > 0.
struct DSV41RT_API YarnConfig {
  double factor = 1.0;
  int64_t original_max_position = 0;
  double beta_fast = 0.0;
  double beta_slow = 0.0;
};

struct DSV41RT_API EngramSpec {
  std::vector<int> layer_ids;
  std::vector<int64_t> num_embeddings;  // table rows per Engram layer
  int max_ngram_size = 0;
  int64_t vocab_size = 0;
  int n_heads = 0;
  int head_dim = 0;
  int pad_token_id = 0;
  int64_t compressed_vocab_size = 0;

  // Table rows looked up per token per layer: one per (n-gram size, head).
  int64_t hash_columns() const { return int64_t(max_ngram_size - 1) * n_heads; }
};

struct DSV41RT_API DSparkSpec {
  int num_stages = 0;
  int block_size = 0;
  int noise_token_id = 0;
  std::vector<int> target_layer_ids;
  int markov_rank = 0;
  int n_routed_experts = 0;
  int num_experts_per_tok = 0;
};

struct DSV41RT_API ModelConfig {
  Arch arch = Arch::kV41;
  int64_t vocab_size = 0, hidden_size = 0, moe_intermediate_size = 0;
  int num_hidden_layers = 0, num_attention_heads = 0, head_dim = 0, qk_rope_head_dim = 0;
  int q_lora_rank = 0, o_lora_rank = 0, o_groups = 0, n_routed_experts = 0, num_experts_per_tok = 0;
  // Read so the validator can reject what the runtime does not implement (must be 1, 1,
  // "sqrtsoftplus", "noaux_tc").
  int64_t num_key_value_heads = 1, n_shared_experts = 1;
  std::string scoring_func, topk_method;
  bool norm_topk_prob = true;  // renormalise the k selected routing scores
  double routed_scaling_factor = 0.0, swiglu_limit = 0.0, rms_norm_eps = 0.0;
  int sliding_window = 0;
  std::vector<int> compress_ratios;  // backbone layers, then one 0 per draft/MTP stage
  double rope_theta = 0.0, compress_rope_theta = 0.0;
  std::optional<YarnConfig> yarn;
  int64_t max_position_embeddings = 0;
  int index_n_heads = 0, index_head_dim = 0, index_topk = 0;
  int hc_mult = 0, hc_sinkhorn_iters = 0;
  double hc_eps = 0.0;
  int num_nextn_predict_layers = 0;
  int bos_token_id = 0, eos_token_id = 0;
  std::optional<int> pad_token_id;
  // V4.1 only.
  std::vector<int> kv_source_layer_ids, index_source_layer_ids;
  int candidate_source_layer_id = -1, candidate_topk_blocks = 0, candidate_block_size = 0;
  std::optional<EngramSpec> engram;
  std::optional<DSparkSpec> dspark;
  // V4 only.
  int num_hash_layers = 0;
  // Storage (quantization_config). Without one the weights are the BF16 values of the release's
  // grid, so the release's block shape (32x32 for V4.1, 128x128 for V4) and FP4 experts still
  // define them (runtime/model/tensor_spec.h).
  bool quantized = false;
  int weight_block_rows = 0, weight_block_cols = 0;
  bool expert_fp4 = true;
  std::string activation_scheme = "dynamic";
  std::string source;  // file path (or the caller's name for it), for error messages

  bool is_v41() const noexcept { return arch == Arch::kV41; }
  // Rows of each mHC mixer: n_hc pre + n_hc post + n_hc^2 Sinkhorn logits.
  int64_t hc_mix_width() const noexcept { return int64_t(2 + hc_mult) * hc_mult; }
};

// Parses and validates a config.json document; `source` prefixes every error message.
DSV41RT_API ModelConfig model_config_from_json(const Json& root, const std::string& source);

// Parses and validates the text of a config.json.
DSV41RT_API ModelConfig parse_model_config_json(std::string_view json_text,
                                                const std::string& source);

// Reads <dir>/config.json for a checkpoint directory, or the file itself.
DSV41RT_API ModelConfig load_model_config(const std::string& checkpoint_dir_or_file);

// The schedule and shape rules (architecture spec §1.1, §1.2): the ones the reference
// implementation enforces plus those our kernels and cache formats rely on. Throws ConfigError
// on the first violated rule. model_config_from_json has already called it.
DSV41RT_API void validate_model_config(const ModelConfig& config);

}  // namespace dsv41rt

// DSV41RT_CONFIG_ERROR(cfg.source, "x must be ", y): throws ConfigError("<source>: x must be y").
#define DSV41RT_CONFIG_ERROR(source, ...)                                                   \
  throw ::dsv41rt::ConfigError(::dsv41rt::StatusCode::kInvalidArgument, __FILE__, __LINE__, \
                               ::dsv41rt::detail::str_cat(source, ": ", __VA_ARGS__))
