// The schedule and shape rules of a parsed ModelConfig (architecture spec §1.1, §1.2): the rules
// the reference implementation enforces plus the ones our kernels and cache formats rely on
// (widths that are multiples of the quantiser blocks, supported compression ratios). Each
// violated rule throws ConfigError naming the field and the layer.
#include <algorithm>
#include <sstream>
#include <utility>

#include "runtime/model/engram_layout.h"
#include "runtime/model/model_config.h"

namespace dsv41rt {
namespace {

template <typename T>
std::string list_text(const std::vector<T>& xs) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < xs.size(); ++i) os << (i ? ", " : "") << xs[i];
  os << "]";
  return os.str();
}

bool contains(const std::vector<int>& xs, int x) {
  return std::find(xs.begin(), xs.end(), x) != xs.end();
}

void check_layer_list(const ModelConfig& c, const char* name, const std::vector<int>& ids,
                      int limit) {
  std::vector<int> sorted(ids);
  std::sort(sorted.begin(), sorted.end());
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  if (sorted != ids) {
    DSV41RT_CONFIG_ERROR(c.source, name, " must be strictly increasing, got ", list_text(ids));
  }
  std::vector<int> bad;
  for (int i : ids) {
    if (i < 0 || i >= limit) bad.push_back(i);
  }
  if (!bad.empty()) {
    DSV41RT_CONFIG_ERROR(c.source, name, " refers to layers ", list_text(bad), " outside 0..",
                         limit - 1);
  }
}

void validate_compress_ratios(const ModelConfig& c) {
  const int64_t needed = int64_t{c.num_hidden_layers} + c.num_nextn_predict_layers;
  const int64_t n_ratios = static_cast<int64_t>(c.compress_ratios.size());
  if (n_ratios < needed) {
    DSV41RT_CONFIG_ERROR(c.source, "compress_ratios has ", n_ratios,
                         " entries but num_hidden_layers + num_nextn_predict_layers = ", needed);
  }
  for (int64_t i = c.num_hidden_layers; i < needed; ++i) {
    if (c.compress_ratios[i] != 0) {
      DSV41RT_CONFIG_ERROR(c.source, "compress_ratios[", i, "] (draft/MTP stage) must be 0, got ",
                           c.compress_ratios[i]);
    }
  }
  const std::vector<int> allowed =
      c.is_v41() ? std::vector<int>{0, 1, 2} : std::vector<int>{0, 4, 128};
  for (size_t i = 0; i < c.compress_ratios.size(); ++i) {
    if (!contains(allowed, c.compress_ratios[i])) {
      DSV41RT_CONFIG_ERROR(c.source, "compress_ratios[", i, "] = ", c.compress_ratios[i],
                           " is not supported for ", arch_name(c.arch),
                           " (allowed: ", list_text(allowed), ")");
    }
  }
  bool any_compressed = false;
  for (int i = 0; i < c.num_hidden_layers; ++i) any_compressed |= c.compress_ratios[i] > 0;
  if (any_compressed && !c.yarn) {
    DSV41RT_CONFIG_ERROR(c.source,
                         "rope_scaling (YaRN) is required when any layer has compress ratio > 0");
  }
}

void validate_common(const ModelConfig& c) {
  const std::string& src = c.source;
  if (c.num_key_value_heads != 1) {
    DSV41RT_CONFIG_ERROR(src, "num_key_value_heads must be 1 (one shared KV latent), got ",
                         c.num_key_value_heads);
  }
  if (c.n_shared_experts != 1) {
    DSV41RT_CONFIG_ERROR(src, "n_shared_experts must be 1, got ", c.n_shared_experts);
  }
  if (c.num_attention_heads % c.o_groups) {
    DSV41RT_CONFIG_ERROR(src, "num_attention_heads (", c.num_attention_heads,
                         ") must be divisible by o_groups (", c.o_groups, ")");
  }
  const int r = c.qk_rope_head_dim;
  if (r % 2 || r > std::min(c.head_dim, c.index_head_dim)) {
    DSV41RT_CONFIG_ERROR(src, "qk_rope_head_dim (", r, ") must be even and <= head_dim (",
                         c.head_dim, ") and index_head_dim (", c.index_head_dim, ")");
  }
  if (c.num_experts_per_tok > c.n_routed_experts) {
    DSV41RT_CONFIG_ERROR(src, "num_experts_per_tok (", c.num_experts_per_tok,
                         ") exceeds n_routed_experts (", c.n_routed_experts, ")");
  }
  if (c.scoring_func != "sqrtsoftplus") {
    DSV41RT_CONFIG_ERROR(src, "scoring_func must be 'sqrtsoftplus', got \"", c.scoring_func, "\"");
  }
  if (c.topk_method != "noaux_tc") {
    DSV41RT_CONFIG_ERROR(src, "topk_method must be 'noaux_tc', got \"", c.topk_method, "\"");
  }
  // Cache formats quantise head/index vectors in blocks of 32 (FP8 window, MXFP4) and 16 (NVFP4).
  const std::pair<const char*, int64_t> widths[] = {{"head_dim", c.head_dim},
                                                    {"index_head_dim", c.index_head_dim},
                                                    {"hidden_size", c.hidden_size}};
  for (const auto& [name, v] : widths) {
    if (v % 32) {
      DSV41RT_CONFIG_ERROR(src, name, " (", v, ") must be a multiple of 32 (quantiser block)");
    }
  }
  if (c.quantized && c.expert_fp4) {
    const std::pair<const char*, int64_t> expert_widths[] = {
        {"hidden_size", c.hidden_size}, {"moe_intermediate_size", c.moe_intermediate_size}};
    for (const auto& [name, v] : expert_widths) {
      if (v % 32) {
        DSV41RT_CONFIG_ERROR(src, name, " (", v, ") must be a multiple of 32 for FP4 experts");
      }
    }
  }
  validate_compress_ratios(c);
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
    DSV41RT_CONFIG_ERROR(c.source, "kv_source_layer_ids ", list_text(missing),
                         " must also be in index_source_layer_ids");
  }
  int owner_ratio = -1;  // -1: no KV source yet
  for (int layer = 0; layer < n; ++layer) {
    const int m = c.compress_ratios[layer];
    if (m == 0) {
      if (contains(kv, layer) || contains(idx, layer)) {
        DSV41RT_CONFIG_ERROR(c.source, "layer ", layer,
                             " has compress ratio 0 (SWA-only) and cannot be a KV or index source");
      }
      continue;
    }
    if (contains(kv, layer)) owner_ratio = m;
    if (owner_ratio != m) {
      DSV41RT_CONFIG_ERROR(c.source, "layer ", layer, " (compress ratio ", m,
                           ") needs a preceding KV source with the same ratio (the most recent KV "
                           "source has ratio ",
                           owner_ratio < 0 ? std::string("none") : std::to_string(owner_ratio),
                           ")");
    }
  }
  const int cand = c.candidate_source_layer_id;
  if (cand >= 0) {
    if (!contains(kv, cand)) {
      DSV41RT_CONFIG_ERROR(c.source, "candidate_source_layer_id ", cand,
                           " must be -1 or one of kv_source_layer_ids ", list_text(kv));
    }
    if (c.candidate_block_size <= 0 || c.candidate_topk_blocks <= 0) {
      DSV41RT_CONFIG_ERROR(c.source,
                           "candidate_block_size and candidate_topk_blocks must be positive when "
                           "candidate_source_layer_id is set");
    }
  }
}

void validate_engram(const ModelConfig& c) {
  if (!c.engram) return;
  const EngramSpec& e = *c.engram;
  check_layer_list(c, "engram_layer_ids", e.layer_ids, c.num_hidden_layers);
  if (e.num_embeddings.size() != e.layer_ids.size()) {
    DSV41RT_CONFIG_ERROR(c.source, "engram_num_embeddings has ", e.num_embeddings.size(),
                         " entries for ", e.layer_ids.size(), " engram_layer_ids");
  }
  if (e.pad_token_id < 0 || e.pad_token_id >= c.vocab_size) {
    DSV41RT_CONFIG_ERROR(c.source, "engram_pad_token_id ", e.pad_token_id,
                         " is outside the vocabulary (0..", c.vocab_size - 1, ")");
  }
  if (e.head_dim % 32) {
    DSV41RT_CONFIG_ERROR(c.source, "engram_head_dim (", e.head_dim,
                         ") must be a multiple of 32 (FP8 row block)");
  }
  const std::vector<EngramLayerLayout> layouts = engram_layouts(e);
  for (size_t l = 0; l < layouts.size(); ++l) {
    if (e.num_embeddings[l] < layouts[l].required_rows) {
      DSV41RT_CONFIG_ERROR(c.source, "engram_num_embeddings for layer ", e.layer_ids[l], " is ",
                           e.num_embeddings[l], ", but its hash buckets need ",
                           layouts[l].required_rows, " rows (sum of primes ",
                           list_text(layouts[l].primes), ")");
    }
  }
}

void validate_dspark(const ModelConfig& c) {
  if (!c.dspark) return;
  const DSparkSpec& d = *c.dspark;
  check_layer_list(c, "dspark_target_layer_ids", d.target_layer_ids, c.num_hidden_layers);
  if (d.target_layer_ids.empty()) {
    DSV41RT_CONFIG_ERROR(
        c.source, "dspark_target_layer_ids must not be empty when num_nextn_predict_layers > 0");
  }
  if (d.num_experts_per_tok > d.n_routed_experts) {
    DSV41RT_CONFIG_ERROR(c.source, "dspark_num_experts_per_tok (", d.num_experts_per_tok,
                         ") exceeds dspark_n_routed_experts (", d.n_routed_experts, ")");
  }
  if (d.block_size < 2) {
    DSV41RT_CONFIG_ERROR(c.source,
                         "dspark_block_size must be >= 2 (anchor + at least one draft slot), got ",
                         d.block_size);
  }
  if (d.noise_token_id < 0 || d.noise_token_id >= c.vocab_size) {
    DSV41RT_CONFIG_ERROR(c.source, "dspark_noise_token_id ", d.noise_token_id,
                         " is outside the vocabulary");
  }
}

void validate_v4(const ModelConfig& c) {
  if (c.num_hash_layers > c.num_hidden_layers) {
    DSV41RT_CONFIG_ERROR(c.source, "num_hash_layers (", c.num_hash_layers,
                         ") exceeds num_hidden_layers (", c.num_hidden_layers, ")");
  }
  if (c.num_hash_layers && c.num_experts_per_tok > c.n_routed_experts) {
    DSV41RT_CONFIG_ERROR(c.source, "hash layers need num_experts_per_tok <= n_routed_experts");
  }
}

}  // namespace

void validate_model_config(const ModelConfig& config) {
  validate_common(config);
  if (config.is_v41()) {
    validate_v41_schedule(config);
    validate_engram(config);
    validate_dspark(config);
  } else {
    validate_v4(config);
  }
}

}  // namespace dsv41rt
