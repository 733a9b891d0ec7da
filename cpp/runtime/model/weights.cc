#include "runtime/model/weights.h"

#include <cstring>

#include "core/dtype.h"
#include "core/status.h"
#include "kernels/quant.h"

namespace dsv41rt::model {
namespace {

namespace k = kernels::cpu;

std::string scale_name(const std::string& weight) {
  const std::string suffix = ".weight";
  if (weight.size() > suffix.size() &&
      weight.compare(weight.size() - suffix.size(), suffix.size(), suffix) == 0) {
    return weight.substr(0, weight.size() - suffix.size()) + ".scale";
  }
  return weight + ".scale";
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

void decode(const TensorSource& src, float* out) {
  switch (src.dtype) {
    case DType::kFP8E4M3:
      k::dequant_fp8_blocks(src.data, src.scale, src.rows, src.cols, src.block_rows, src.block_cols,
                            out);
      break;
    case DType::kI8:
      k::dequant_fp4_rows(src.data, src.scale, src.rows, src.cols, out);
      break;
    default:
      decode_to_f32(src.dtype, src.data, src.rows * src.cols, out);
  }
}

class Loader {
 public:
  Loader(const Checkpoint& ck, const ModelConfig& cfg, bool host_values)
      : ck_(ck), cfg_(cfg), host_values_(host_values) {}

  bool has(const std::string& name) const { return ck_.contains(name); }

  /// The logical FP32 tensor `name` of shape `shape`, whatever its storage.
  Tensor load(const std::string& name, std::vector<int64_t> shape, bool fp4_expert = false) const {
    DSV41RT_CHECK_CODE(kNotFound, ck_.contains(name), ck_.path(), ": missing tensor ", name);
    const TensorInfo& info = ck_.info(name);
    Tensor t;
    t.shape = shape;
    const int64_t n = t.numel();
    const uint8_t* raw = ck_.tensor_data(name);
    const int64_t rows = shape.empty() ? 1 : shape[0];
    const int64_t cols = rows ? n / rows : 0;
    TensorSource& src = t.source;
    src.dtype = info.dtype;
    src.data = raw;
    src.rows = rows;
    src.cols = cols;
    switch (info.dtype) {
      case DType::kF32:
      case DType::kBF16:
      case DType::kF16:
        expect_shape(info, shape);
        break;
      case DType::kFP8E4M3: {
        expect_shape(info, shape);
        const std::string sname = scale_name(name);
        DSV41RT_CHECK_CODE(kNotFound, ck_.contains(sname), ck_.path(), ": FP8 tensor ", name,
                           " has no scale tensor ", sname);
        const TensorInfo& si = ck_.info(sname);
        DSV41RT_CHECK(si.dtype == DType::kE8M0 && si.shape.size() == 2, "scale tensor ", sname,
                      " must be F8_E8M0 2-D");
        const int64_t br = cfg_.weight_block_rows, bc = cfg_.weight_block_cols;
        const std::vector<int64_t> grid = {(rows + br - 1) / br, (cols + bc - 1) / bc};
        DSV41RT_CHECK(si.shape == grid, ck_.path(), ": scale tensor ", sname, " has shape ",
                      shape_str(si.shape), ", expected ", shape_str(grid), " for ", br, "x", bc,
                      " blocks");
        src.scale = ck_.tensor_data(sname);
        src.block_rows = br;
        src.block_cols = bc;
        break;
      }
      case DType::kI8: {
        DSV41RT_CHECK(fp4_expert, "tensor ", name, " is I8 but only routed experts are stored FP4");
        expect_shape(info, {rows, cols / 2});
        const std::string sname = scale_name(name);
        DSV41RT_CHECK_CODE(kNotFound, ck_.contains(sname), ck_.path(), ": FP4 tensor ", name,
                           " has no scale tensor ", sname);
        src.scale = ck_.tensor_data(sname);
        break;
      }
      default:
        DSV41RT_THROW_CODE(kUnsupported, ck_.path(), ": tensor ", name, " has unsupported dtype ",
                           dtype_name(info.dtype));
    }
    if (host_values_) {
      t.data.resize(static_cast<size_t>(n));
      decode(src, t.data.data());
    }
    return t;
  }

 private:
  void expect_shape(const TensorInfo& info, const std::vector<int64_t>& shape) const {
    DSV41RT_CHECK(info.shape == shape, ck_.path(), ": tensor ", info.name, " has shape ",
                  shape_str(info.shape), ", expected ", shape_str(shape));
  }

  const Checkpoint& ck_;
  const ModelConfig& cfg_;
  bool host_values_;
};

void load_attention(const Loader& L, const ModelConfig& c, const LayerPlan& layer,
                    const std::string& p, AttentionWeights& w) {
  const int64_t H = c.hidden_size, D = c.head_dim, nh = c.num_attention_heads;
  w.wq_a = L.load(p + "attn.wq_a.weight", {c.q_lora_rank, H});
  w.q_norm = L.load(p + "attn.q_norm.weight", {c.q_lora_rank});
  w.wq_b = L.load(p + "attn.wq_b.weight", {nh * D, c.q_lora_rank});
  w.wkv = L.load(p + "attn.wkv.weight", {D, H});
  w.kv_norm = L.load(p + "attn.kv_norm.weight", {D});
  w.wo_a =
      L.load(p + "attn.wo_a.weight", {int64_t(c.o_groups) * c.o_lora_rank, nh * D / c.o_groups});
  w.wo_b = L.load(p + "attn.wo_b.weight", {H, int64_t(c.o_groups) * c.o_lora_rank});
  w.attn_sink = L.load(p + "attn.attn_sink", {nh});
  const int64_t DI = c.index_head_dim, HI = c.index_n_heads;
  if (layer.role == LayerRole::kFull) {
    w.comp_wkv = L.load(p + "attn.compressor.wkv.weight", {D, H});
    if (layer.ratio > 1) w.comp_wgate = L.load(p + "attn.compressor.wgate.weight", {D, H});
    w.comp_norm = L.load(p + "attn.compressor.norm.weight", {D});
    w.idx_wk = L.load(p + "attn.indexer.wk.weight", {DI, D});
    w.idx_k_norm = L.load(p + "attn.indexer.k_norm.weight", {DI});
  }
  if (layer.role == LayerRole::kFull || layer.role == LayerRole::kReindex) {
    w.idx_wq_b = L.load(p + "attn.indexer.wq_b.weight", {HI * DI, c.q_lora_rank});
    w.idx_weights_proj = L.load(p + "attn.indexer.weights_proj.weight", {HI, H});
  }
}

void load_moe(const Loader& L, const ModelConfig& c, const LayerPlan& layer, const std::string& p,
              MoeWeights& w) {
  const int64_t H = c.hidden_size, I = c.moe_intermediate_size, E = layer.n_experts;
  w.gate = L.load(p + "ffn.gate.weight", {E, H});
  DSV41RT_CHECK_CODE(kUnsupported, !layer.hash_routed, "layer ", layer.index,
                     ": hash-routed MoE (V4) is not supported yet");
  w.bias = L.load(p + "ffn.gate.bias", {E});
  const bool fp4 = c.expert_fp4;
  for (int64_t e = 0; e < E; ++e) {
    const std::string q = p + "ffn.experts." + std::to_string(e) + ".";
    w.w1.push_back(L.load(q + "w1.weight", {I, H}, fp4));
    w.w2.push_back(L.load(q + "w2.weight", {H, I}, fp4));
    w.w3.push_back(L.load(q + "w3.weight", {I, H}, fp4));
  }
  w.shared_w1 = L.load(p + "ffn.shared_experts.w1.weight", {I, H});
  w.shared_w2 = L.load(p + "ffn.shared_experts.w2.weight", {H, I});
  w.shared_w3 = L.load(p + "ffn.shared_experts.w3.weight", {I, H});
}

EngramWeights load_engram(const Checkpoint& ck, const Loader& L, const ModelConfig& c,
                          int layer_pos, const std::string& p) {
  const EngramSpec& e = *c.engram;
  EngramWeights w;
  const std::string table = p + "engram.embed.weight";
  const TensorInfo& ti = ck.info(table);
  w.rows = e.num_embeddings[layer_pos];
  DSV41RT_CHECK(
      ti.dtype == DType::kFP8E4M3 && ti.shape == std::vector<int64_t>({w.rows, e.head_dim}),
      ck.path(), ": Engram table ", table, " must be F8_E4M3 ", shape_str({w.rows, e.head_dim}),
      " (BF16 Engram tables are not supported yet)");
  w.table = ck.tensor_data(table);
  const std::string sname = p + "engram.embed.scale";
  DSV41RT_CHECK(
      ck.contains(sname) && ck.info(sname).shape == std::vector<int64_t>({w.rows, e.head_dim / 32}),
      ck.path(), ": Engram scale ", sname, " missing or not ",
      shape_str({w.rows, e.head_dim / 32}));
  w.table_scale = ck.tensor_data(sname);
  const int64_t cols = int64_t(e.max_ngram_size - 1) * e.n_heads * e.head_dim;
  w.wkv = L.load(p + "engram.wkv.weight", {int64_t(c.hc_mult + 1) * c.hidden_size, cols});
  w.q_weight = L.load(p + "engram.q_weight", {c.hc_mult, c.hidden_size});
  w.k_weight = L.load(p + "engram.k_weight", {c.hc_mult, c.hidden_size});
  return w;
}

}  // namespace

bool bf16_exact(const Tensor& t) {
  const DType d = t.source.dtype;
  return d == DType::kFP8E4M3 || d == DType::kI8 || d == DType::kBF16;
}

std::vector<float> host_values(const Tensor& t) {
  if (!t.data.empty() || t.source.data == nullptr) return t.data;
  std::vector<float> out(size_t(t.numel()));
  decode(t.source, out.data());
  return out;
}

ModelWeights load_weights(std::shared_ptr<Checkpoint> checkpoint, const ModelPlan& plan,
                          bool host_values, const std::function<void(int64_t, int64_t)>& progress) {
  const ModelConfig& c = plan.config;
  DSV41RT_CHECK_CODE(kUnsupported, c.arch == Arch::kV41, c.source,
                     ": dsv41rt runs DeepSeek-V4.1 checkpoints only (V4 is not supported yet)");
  Loader L(*checkpoint, c, host_values);
  ModelWeights w;
  w.checkpoint = checkpoint;
  const TensorInfo& ei = checkpoint->info("embed.weight");
  DSV41RT_CHECK(ei.shape == std::vector<int64_t>({c.vocab_size, c.hidden_size}), checkpoint->path(),
                ": tensor embed.weight has shape ", shape_str(ei.shape), ", expected ",
                shape_str({c.vocab_size, c.hidden_size}));
  if (ei.dtype == DType::kBF16) {
    w.embed_bf16 = reinterpret_cast<const uint16_t*>(checkpoint->tensor_data("embed.weight"));
  } else {
    w.embed = L.load("embed.weight", {c.vocab_size, c.hidden_size});
  }
  w.head = L.load("head.weight", {c.vocab_size, c.hidden_size});
  w.norm = L.load("norm.weight", {c.hidden_size});
  const int64_t mix = int64_t(2 + c.hc_mult) * c.hc_mult, nH = int64_t(c.hc_mult) * c.hidden_size;
  for (const LayerPlan& layer : plan.layers) {
    const std::string p = layer.name_prefix();
    BlockWeights b;
    b.attn_norm = L.load(p + "attn_norm.weight", {c.hidden_size});
    b.ffn_norm = L.load(p + "ffn_norm.weight", {c.hidden_size});
    b.hc_attn_fn = L.load(p + "hc_attn_fn", {mix, nH});
    b.hc_attn_base = L.load(p + "hc_attn_base", {mix});
    b.hc_attn_scale = L.load(p + "hc_attn_scale", {3});
    b.hc_ffn_fn = L.load(p + "hc_ffn_fn", {mix, nH});
    b.hc_ffn_base = L.load(p + "hc_ffn_base", {mix});
    b.hc_ffn_scale = L.load(p + "hc_ffn_scale", {3});
    load_attention(L, c, layer, p, b.attn);
    load_moe(L, c, layer, p, b.moe);
    if (layer.engram) {
      int pos = 0;
      while (c.engram->layer_ids[pos] != layer.index) ++pos;
      b.engram = load_engram(*checkpoint, L, c, pos, p);
    }
    w.layers.push_back(std::move(b));
    if (progress) progress(int64_t(w.layers.size()), int64_t(plan.layers.size()));
  }
  return w;
}

}  // namespace dsv41rt::model
