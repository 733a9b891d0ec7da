// ModelConfig parsing/validation and the per-layer plan (tests/python/test_config.py runs the same
// parser through the bindings on every preset and broken config).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/status.h"
#include "runtime/model/layer_plan.h"
#include "runtime/model/model_config.h"

namespace dsv41rt {
namespace {

// 6 backbone layers: SWA | ratio 2: Full, Reuse | ratio 1: Full (candidate source), Reindex
// (candidate user), Reuse; Engram on 0 and 4; one DSpark stage.
const char* kV41 = R"({
  "model_type": "deepseek_v41", "bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2,
  "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
    "activation_scheme": "dynamic", "weight_block_size": [32, 32], "expert_dtype": "fp4"},
  "text_config": {
    "vocab_size": 1000, "hidden_size": 64, "moe_intermediate_size": 32, "num_hidden_layers": 6,
    "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 64, "qk_rope_head_dim": 16,
    "q_lora_rank": 32, "o_lora_rank": 32, "o_groups": 2, "n_routed_experts": 8,
    "num_experts_per_tok": 2, "routed_scaling_factor": 1.5, "sliding_window": 8,
    "compress_ratios": [0, 2, 2, 1, 1, 1, 0], "rope_theta": 10000.0,
    "compress_rope_theta": 160000.0,
    "rope_scaling": {"rope_type": "yarn", "factor": 16, "beta_fast": 32, "beta_slow": 1,
                     "original_max_position_embeddings": 65536},
    "index_n_heads": 4, "index_head_dim": 32, "index_topk": 8, "hc_mult": 2,
    "kv_source_layer_ids": [1, 3], "index_source_layer_ids": [1, 3, 4],
    "candidate_source_layer_id": 3, "candidate_topk_blocks": 3, "candidate_block_size": 4,
    "engram_layer_ids": [0, 4], "engram_num_embeddings": [11, 13], "engram_max_ngram_size": 2,
    "engram_vocab_size": 10, "engram_n_heads": 1, "engram_head_dim": 32,
    "engram_compressed_vocab_size": 10,
    "num_nextn_predict_layers": 1, "dspark_block_size": 5, "dspark_noise_token_id": 999,
    "dspark_target_layer_ids": [3, 5], "dspark_markov_rank": 16, "dspark_n_routed_experts": 4,
    "dspark_num_experts_per_tok": 1
  }
})";

// SWA, CSA(4), HCA(128), CSA; layers 0-1 hash-routed; one MTP layer; V4's legacy rope key `type`.
const char* kV4 = R"({
  "model_type": "deepseek_v4", "vocab_size": 1000, "hidden_size": 64,
  "moe_intermediate_size": 32, "num_hidden_layers": 4, "num_attention_heads": 4, "head_dim": 64,
  "qk_rope_head_dim": 16, "q_lora_rank": 32, "o_lora_rank": 32, "o_groups": 2,
  "n_routed_experts": 8, "num_experts_per_tok": 2, "routed_scaling_factor": 1.5,
  "sliding_window": 8, "compress_ratios": [0, 4, 128, 4, 0],
  "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                   "beta_fast": 32, "beta_slow": 1},
  "index_n_heads": 4, "index_head_dim": 32, "index_topk": 8, "num_hash_layers": 2,
  "num_nextn_predict_layers": 1, "pad_token_id": null, "expert_dtype": "fp4",
  "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}
})";

std::string replaced(std::string text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

std::string error_of(const std::string& text) {
  try {
    parse_model_config_json(text, "/ck/config.json");
  } catch (const ConfigError& e) {
    return e.message();
  }
  return "";
}

TEST(ModelConfig, ParsesV41) {
  const ModelConfig c = parse_model_config_json(kV41, "/ck/config.json");
  EXPECT_EQ(c.arch, Arch::kV41);
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.num_hidden_layers, 6);
  EXPECT_EQ(c.rms_norm_eps, 1e-20);  // V4.1 default
  EXPECT_EQ(c.hc_sinkhorn_iters, 20);
  EXPECT_EQ(c.swiglu_limit, 10.0);
  ASSERT_TRUE(c.yarn.has_value());
  EXPECT_EQ(c.yarn->factor, 16.0);
  EXPECT_EQ(c.yarn->original_max_position, 65536);
  ASSERT_TRUE(c.engram.has_value());
  EXPECT_EQ(c.engram->pad_token_id, 2);
  ASSERT_TRUE(c.dspark.has_value());
  EXPECT_EQ(c.dspark->num_stages, 1);
  EXPECT_TRUE(c.quantized);
  EXPECT_EQ(c.weight_block_rows, 32);
  EXPECT_TRUE(c.expert_fp4);
  EXPECT_EQ(c.source, "/ck/config.json");
}

TEST(ModelConfig, V41Plan) {
  const ModelPlan plan = build_model_plan(parse_model_config_json(kV41, "cfg.json"));
  ASSERT_EQ(plan.layers.size(), 6u);
  const LayerRole roles[] = {LayerRole::kSwa,  LayerRole::kFull,    LayerRole::kReuse,
                             LayerRole::kFull, LayerRole::kReindex, LayerRole::kReuse};
  const int kv[] = {-1, 1, 1, 3, 3, 3}, topk[] = {-1, 1, 1, 3, 4, 4};
  const CandidateRole cand[] = {CandidateRole::kNone,   CandidateRole::kNone, CandidateRole::kNone,
                                CandidateRole::kSource, CandidateRole::kUses, CandidateRole::kNone};
  for (int i = 0; i < 6; ++i) {
    const LayerPlan& l = plan.layers[i];
    EXPECT_EQ(l.index, i);
    EXPECT_FALSE(l.draft());
    EXPECT_EQ(l.role, roles[i]) << i;
    EXPECT_EQ(l.kv_source, kv[i]) << i;
    EXPECT_EQ(l.topk_source, topk[i]) << i;
    EXPECT_EQ(l.candidates, cand[i]) << i;
    EXPECT_EQ(l.engram, i == 0 || i == 4) << i;
    EXPECT_EQ(l.rope_base, i == 0 ? 10000.0 : 160000.0) << i;
    EXPECT_EQ(l.yarn, i != 0) << i;
    EXPECT_FALSE(l.hash_routed);
    EXPECT_EQ(l.n_experts, 8);
  }
  EXPECT_EQ(plan.layers[4].name_prefix(), "layers.4.");
  EXPECT_STREQ(layer_role_name(plan.layers[4].role), "Reindex");
  EXPECT_TRUE(plan.layers[3].owns_compressor() && plan.layers[4].owns_indexer());
  EXPECT_FALSE(plan.layers[5].owns_indexer());
  ASSERT_EQ(plan.draft_layers.size(), 1u);
  const LayerPlan& d = plan.draft_layers[0];
  EXPECT_TRUE(d.draft());
  EXPECT_EQ(d.stage, LayerStage::kDspark);
  EXPECT_EQ(d.name_prefix(), "mtp.0.");
  EXPECT_EQ(d.role, LayerRole::kSwa);
  EXPECT_EQ(d.rope_base, 10000.0);
  EXPECT_FALSE(d.yarn);
  EXPECT_EQ(d.n_experts, 4);  // DSpark's own expert count
  EXPECT_EQ(d.experts_per_tok, 1);
}

TEST(ModelConfig, V4Plan) {
  const ModelPlan plan = build_model_plan(parse_model_config_json(kV4, "cfg.json"));
  const ModelConfig& c = plan.config;
  EXPECT_EQ(c.arch, Arch::kV4);
  EXPECT_EQ(c.rms_norm_eps, 1e-6);  // V4 default
  EXPECT_EQ(c.weight_block_rows, 128);
  EXPECT_TRUE(c.expert_fp4);  // top-level expert_dtype
  ASSERT_EQ(plan.layers.size(), 4u);
  const LayerRole roles[] = {LayerRole::kSwa, LayerRole::kCsa, LayerRole::kHca, LayerRole::kCsa};
  const int kv[] = {-1, 1, 2, 3}, topk[] = {-1, 1, -1, 3};
  for (int i = 0; i < 4; ++i) {
    const LayerPlan& l = plan.layers[i];
    EXPECT_EQ(l.role, roles[i]) << i;
    EXPECT_EQ(l.kv_source, kv[i]) << i;
    EXPECT_EQ(l.topk_source, topk[i]) << i;
    EXPECT_EQ(l.candidates, CandidateRole::kNone);
    EXPECT_EQ(l.hash_routed, i < 2) << i;
    EXPECT_EQ(l.yarn, i != 0) << i;
  }
  EXPECT_STREQ(layer_role_name(LayerRole::kHca), "HCA");
  ASSERT_EQ(plan.draft_layers.size(), 1u);
  EXPECT_EQ(plan.draft_layers[0].n_experts, 8);
  EXPECT_EQ(plan.draft_layers[0].stage, LayerStage::kMtp);
  EXPECT_EQ(plan.draft_layers[0].name_prefix(), "mtp.0.");
}

TEST(ModelConfig, UnquantizedUsesReleaseDefaults) {
  std::string v4 = kV4;
  v4 = replaced(
      v4, R"("quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]})",
      R"("dtype": "bfloat16")");
  const ModelConfig c = parse_model_config_json(v4, "cfg.json");
  EXPECT_FALSE(c.quantized);
  EXPECT_EQ(c.weight_block_rows, 128);
  EXPECT_EQ(c.weight_block_cols, 128);
  EXPECT_TRUE(c.expert_fp4);
  std::string v41 = replaced(kV41, R"("weight_block_size": [32, 32], "expert_dtype": "fp4")",
                             R"("weight_block_size": [64, 32], "expert_dtype": "fp8")");
  const ModelConfig q = parse_model_config_json(v41, "cfg.json");
  EXPECT_TRUE(q.quantized);
  EXPECT_EQ(q.weight_block_rows, 64);
  EXPECT_EQ(q.weight_block_cols, 32);
  EXPECT_FALSE(q.expert_fp4);
}

struct BadCase {
  const char* from;
  const char* to;
  const char* needle;
};

TEST(ModelConfig, ErrorsNameTheFileAndField) {
  const BadCase cases[] = {
      {R"("hidden_size": 64)", R"("hidden_size": "64")",
       "/ck/config.json: text_config.hidden_size must be an integer, got \"64\""},
      {R"("hidden_size": 64)", R"("hidden_size": true)",
       "text_config.hidden_size must be an integer"},
      {R"("hidden_size": 64)", R"("hidden_size": 48)", "hidden_size (48) must be a multiple of 32"},
      {R"("num_hidden_layers": 6)", R"("num_hidden_layers": 0)",
       "text_config.num_hidden_layers must be an integer >= 1"},
      {R"("q_lora_rank": 32,)", "", "required field text_config.q_lora_rank is missing"},
      {R"("routed_scaling_factor": 1.5)", R"("routed_scaling_factor": -1)",
       "text_config.routed_scaling_factor must be a positive number"},
      {R"([0, 2, 2, 1, 1, 1, 0])", "[0, 2, 2]", "compress_ratios has 3 entries"},
      {R"([0, 2, 2, 1, 1, 1, 0])", "[0, 3, 2, 1, 1, 1, 0]",
       "compress_ratios[1] = 3 is not supported"},
      {R"([0, 2, 2, 1, 1, 1, 0])", "[0, 2, 2, 1, 1, 1, 2]", "compress_ratios[6] (draft/MTP stage)"},
      {R"("kv_source_layer_ids": [1, 3])", R"("kv_source_layer_ids": [3, 1])",
       "kv_source_layer_ids must be strictly increasing"},
      {R"("kv_source_layer_ids": [1, 3])", R"("kv_source_layer_ids": [1, 3, 5])",
       "kv_source_layer_ids [5] must also be in index_source_layer_ids"},
      {R"("kv_source_layer_ids": [1, 3])", R"("kv_source_layer_ids": [1])",
       "layer 3 (compress ratio 1) needs a preceding KV source with the same ratio"},
      {R"("candidate_source_layer_id": 3)", R"("candidate_source_layer_id": 4)",
       "candidate_source_layer_id 4 must be -1 or one of kv_source_layer_ids [1, 3]"},
      {R"("o_groups": 2)", R"("o_groups": 3)", "divisible by o_groups"},
      {R"("qk_rope_head_dim": 16)", R"("qk_rope_head_dim": 15)",
       "qk_rope_head_dim (15) must be even"},
      {R"("qk_rope_head_dim": 16)", R"("qk_rope_head_dim": 40)",
       "qk_rope_head_dim (40) must be even"},
      {R"("num_key_value_heads": 1)", R"("num_key_value_heads": 2)",
       "num_key_value_heads must be 1"},
      {R"("rope_type": "yarn")", R"("rope_type": "linear")",
       "text_config.rope_scaling.rope_type must be 'yarn'"},
      {R"("engram_num_embeddings": [11, 13])", R"("engram_num_embeddings": [11, 12])",
       "engram_num_embeddings for layer 4 is 12"},
      {R"("dspark_target_layer_ids": [3, 5])", R"("dspark_target_layer_ids": [3, 6])",
       "dspark_target_layer_ids refers to layers [6]"},
      {R"("weight_block_size": [32, 32])", R"("weight_block_size": [32])",
       "quantization_config.weight_block_size must be two positive integers"},
      {R"("expert_dtype": "fp4")", R"("expert_dtype": "int4")",
       "expert_dtype must be 'fp4' or 'fp8'"},
      {R"("model_type": "deepseek_v41")", R"("model_type": "llama")",
       "model_type must be 'deepseek_v41' or 'deepseek_v4'"},
      {R"("hc_mult": 2,)", R"("hc_mult": 2,,)", "/ck/config.json: not valid JSON"},
  };
  for (const BadCase& c : cases) {
    const std::string msg = error_of(replaced(kV41, c.from, c.to));
    EXPECT_NE(msg.find(c.needle), std::string::npos) << c.needle << "\n  got: " << msg;
    EXPECT_EQ(msg.rfind("/ck/config.json: ", 0), 0u) << msg;
  }
  EXPECT_NE(error_of("[1]").find("config must be a JSON object, got array"), std::string::npos);
  EXPECT_NE(error_of(R"({"model_type": "deepseek_v41", "text_config": [1]})")
                .find("text_config must be a JSON object"),
            std::string::npos);
  EXPECT_NE(error_of(replaced(kV4, "[0, 4, 128, 4, 0]", "[0, 4, 2, 4, 0]"))
                .find("compress_ratios[2] = 2 is not supported for deepseek_v4"),
            std::string::npos);
  EXPECT_NE(error_of(replaced(kV4, R"("num_hash_layers": 2)", R"("num_hash_layers": 5)"))
                .find("num_hash_layers (5) exceeds num_hidden_layers (4)"),
            std::string::npos);
}

TEST(ModelConfig, LoadsFromDirectory) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("dsv41rt_model_config_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  try {
    load_model_config(dir.string());
    ADD_FAILURE() << "expected an error";
  } catch (const ConfigError& e) {
    EXPECT_NE(e.message().find("config.json: no config.json found"), std::string::npos);
    EXPECT_EQ(e.kind(), StatusCode::kNotFound);
  }
  { std::ofstream(dir / "config.json") << kV4; }
  const ModelConfig c = load_model_config(dir.string());
  EXPECT_EQ(c.source, (dir / "config.json").string());
  EXPECT_EQ(load_model_config((dir / "config.json").string()).num_hidden_layers, 4);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace dsv41rt
