#include "runtime/model/layer_plan.h"

#include <algorithm>
#include <string>
#include <utility>

#include "core/enum_names.h"
#include "core/status.h"

namespace dsv41rt {
namespace {

bool contains(const std::vector<int>& xs, int x) {
  return std::find(xs.begin(), xs.end(), x) != xs.end();
}

// The largest entry <= i, or -1.
int latest_at_or_before(const std::vector<int>& xs, int i) {
  int best = -1;
  for (int s : xs) {
    if (s <= i) best = std::max(best, s);
  }
  return best;
}

// Ratio-0 layers (SWA-only, draft stages) use rope_theta without YaRN; every compressed layer uses
// compress_rope_theta with YaRN for all of its rotations (query, window KV, compressed KV,
// indexer).
void set_rope(const ModelConfig& cfg, LayerPlan& p) {
  if (p.ratio == 0) {
    p.rope_base = cfg.rope_theta;
    p.yarn = false;
  } else {
    p.rope_base = cfg.compress_rope_theta;
    p.yarn = cfg.yarn.has_value();
  }
}

LayerPlan v41_layer(const ModelConfig& cfg, int i) {
  LayerPlan p;
  p.index = i;
  p.ratio = cfg.compress_ratios[i];
  set_rope(cfg, p);
  const std::vector<int>&kv = cfg.kv_source_layer_ids, &idx = cfg.index_source_layer_ids;
  if (p.ratio > 0) {
    p.kv_source = latest_at_or_before(kv, i);     // the most recent KV source owns this group
    p.topk_source = latest_at_or_before(idx, i);  // the most recently published selection
    if (p.kv_source < 0 || p.topk_source < 0) {
      DSV41RT_CONFIG_ERROR(cfg.source, "layer ", i, " (compress ratio ", p.ratio,
                           ") has no preceding KV/index source");
    }
    p.role = contains(kv, i)    ? LayerRole::kFull
             : contains(idx, i) ? LayerRole::kReindex
                                : LayerRole::kReuse;
    const int c = cfg.candidate_source_layer_id;
    if (i == c) {
      p.candidates = CandidateRole::kSource;
    } else if (contains(idx, i) && 0 <= c && c < i) {
      p.candidates = CandidateRole::kUses;
    }
  }
  p.engram = cfg.engram.has_value() && contains(cfg.engram->layer_ids, i);
  p.n_experts = cfg.n_routed_experts;
  p.experts_per_tok = cfg.num_experts_per_tok;
  return p;
}

LayerPlan v4_layer(const ModelConfig& cfg, int i) {
  LayerPlan p;
  p.index = i;
  p.ratio = cfg.compress_ratios[i];
  set_rope(cfg, p);
  switch (p.ratio) {
    case 0:
      p.role = LayerRole::kSwa;
      break;
    case 4:
      p.role = LayerRole::kCsa;
      break;
    case 128:
      p.role = LayerRole::kHca;
      break;
    default:
      DSV41RT_CONFIG_ERROR(cfg.source, "compress_ratios[", i, "] = ", p.ratio,
                           " is not supported for deepseek_v4");
  }
  p.kv_source = p.ratio > 0 ? i : -1;
  p.topk_source = p.ratio == 4 ? i : -1;
  p.hash_routed = i < cfg.num_hash_layers;
  p.n_experts = cfg.n_routed_experts;
  p.experts_per_tok = cfg.num_experts_per_tok;
  return p;
}

}  // namespace

const char* layer_role_name(LayerRole role) noexcept {
  static constexpr const char* kNames[] = {"SWA-only", "Full", "Reindex", "Reuse", "CSA", "HCA"};
  return enum_name(role, kNames, "?");
}

const char* candidate_role_name(CandidateRole role) noexcept {
  static constexpr const char* kNames[] = {"", "source", "uses"};
  return enum_name(role, kNames, "?");
}

const char* layer_stage_name(LayerStage stage) noexcept {
  static constexpr const char* kNames[] = {"backbone", "dspark", "mtp"};
  return enum_name(stage, kNames, "?");
}

std::string LayerPlan::name_prefix() const {
  return (draft() ? "mtp." : "layers.") + std::to_string(index) + ".";
}

ModelPlan build_model_plan(ModelConfig config) {
  ModelPlan plan;
  plan.config = std::move(config);
  const ModelConfig& cfg = plan.config;
  if (static_cast<int64_t>(cfg.compress_ratios.size()) <
      int64_t{cfg.num_hidden_layers} + cfg.num_nextn_predict_layers) {
    DSV41RT_CONFIG_ERROR(cfg.source, "compress_ratios is shorter than the layer count");
  }
  plan.layers.reserve(cfg.num_hidden_layers);
  for (int i = 0; i < cfg.num_hidden_layers; ++i) {
    plan.layers.push_back(cfg.is_v41() ? v41_layer(cfg, i) : v4_layer(cfg, i));
  }
  for (int s = 0; s < cfg.num_nextn_predict_layers; ++s) {
    LayerPlan p;
    p.index = s;
    p.stage = cfg.dspark ? LayerStage::kDspark : LayerStage::kMtp;
    set_rope(cfg, p);
    if (cfg.dspark) {
      p.n_experts = cfg.dspark->n_routed_experts;
      p.experts_per_tok = cfg.dspark->num_experts_per_tok;
    } else {
      p.n_experts = cfg.n_routed_experts;
      p.experts_per_tok = cfg.num_experts_per_tok;
    }
    plan.draft_layers.push_back(p);
  }
  return plan;
}

}  // namespace dsv41rt
