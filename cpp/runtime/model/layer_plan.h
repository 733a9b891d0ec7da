// The per-layer plan: what each layer is and where its shared state comes from.
//
// Architecture spec §2.9 (V4.1 roles and the released schedule), §2.10 (V4), §2.4 (rope base per
// layer). Built once from a validated ModelConfig; everything downstream (tensor spec, executor,
// cache accounting, Python's dsv41rt.config.build_plan and `inspect`) reads the plan instead of
// re-deriving roles.
#pragma once

#include <string>
#include <vector>

#include "core/export.h"
#include "runtime/model/model_config.h"

namespace dsv41rt {

enum class LayerRole {
  kSwa,      // window branch only (ratio 0)
  kFull,     // V4.1: owns compressor + index keys, publishes top-k
  kReindex,  // V4.1: own indexer queries over the group's shared keys
  kReuse,    // V4.1: reuses the latest top-k and the group's compressed KV
  kCsa,      // V4: ratio-4 overlapped compressor + own indexer
  kHca,      // V4: ratio-128 compressor, attends every visible entry
};

enum class LayerStage {
  kBackbone,
  kDspark,  // V4.1 draft stage mtp.s
  kMtp,     // V4 next-token-prediction layer mtp.0
};

enum class CandidateRole {
  kNone,
  kSource,  // builds and publishes the candidate-block mask
  kUses,    // restricts its top-k to the published candidate pool
};

// "SWA-only", "Full", "Reindex", "Reuse", "CSA", "HCA" (Python's Role values).
DSV41RT_API const char* layer_role_name(LayerRole role) noexcept;
// "", "source", "uses" (Python's Candidates values).
DSV41RT_API const char* candidate_role_name(CandidateRole role) noexcept;
// "backbone", "dspark", "mtp" (Python's Stage values).
DSV41RT_API const char* layer_stage_name(LayerStage stage) noexcept;

struct DSV41RT_API LayerPlan {
  int index = 0;  // backbone layer index, or stage index for DSpark/MTP
  LayerStage stage = LayerStage::kBackbone;
  int ratio = 0;
  LayerRole role = LayerRole::kSwa;
  int kv_source = -1;    // layer whose compressed KV this layer attends (-1: none)
  int topk_source = -1;  // layer whose top-k selection this layer uses (-1: none / all visible)
  CandidateRole candidates = CandidateRole::kNone;
  bool engram = false;
  double rope_base = 0.0;
  bool yarn = false;
  bool hash_routed = false;
  int n_experts = 0;
  int experts_per_tok = 0;

  // Prefix of this layer's tensors in the released checkpoint: "layers.N." or "mtp.N.".
  std::string name_prefix() const;
  // DSpark stage (V4.1) or MTP layer (V4).
  bool draft() const noexcept { return stage != LayerStage::kBackbone; }
  bool owns_compressor() const noexcept {
    return role == LayerRole::kFull || role == LayerRole::kCsa || role == LayerRole::kHca;
  }
  bool owns_indexer() const noexcept {
    return role == LayerRole::kFull || role == LayerRole::kReindex || role == LayerRole::kCsa;
  }
};

struct DSV41RT_API ModelPlan {
  ModelConfig config;
  std::vector<LayerPlan> layers;        // backbone layers
  std::vector<LayerPlan> draft_layers;  // DSpark stages (V4.1) or MTP layers (V4)
};

// `config` must come from model_config_from_json / load_model_config (validated); the schedule
// invariants the plan relies on are re-checked and a violation throws ConfigError.
DSV41RT_API ModelPlan build_model_plan(ModelConfig config);

}  // namespace dsv41rt
