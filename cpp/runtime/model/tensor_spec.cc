#include "runtime/model/tensor_spec.h"

#include <algorithm>
#include <map>
#include <utility>

#include "core/enum_names.h"

namespace dsv41rt {
namespace {

using Shape = std::vector<int64_t>;

// The logical weights of one plan, in the order the blocks are walked (sorted at the end).
class SpecBuilder {
 public:
  explicit SpecBuilder(const ModelPlan& plan) : plan_(plan), c_(plan.config) {}

  std::vector<LogicalTensor> build() {
    const int64_t h = c_.hidden_size;
    add("embed.weight", {c_.vocab_size, h}, WeightStorage::kBF16);
    add("head.weight", {c_.vocab_size, h}, WeightStorage::kBF16);
    add("norm.weight", {h}, WeightStorage::kBF16);
    if (!c_.is_v41()) hc_head("");
    for (const LayerPlan& layer : plan_.layers) {
      block_common(layer);
      if (layer.engram) engram(layer);
    }
    drafts();
    std::sort(out_.begin(), out_.end(),
              [](const LogicalTensor& a, const LogicalTensor& b) { return a.name < b.name; });
    return std::move(out_);
  }

 private:
  void add(std::string name, Shape shape, WeightStorage storage, int br = 0, int bc = 0) {
    if (storage == WeightStorage::kFP8 && br == 0) {
      // The config's block (the release's when unquantised, see ModelConfig::quantized).
      br = c_.weight_block_rows;
      bc = c_.weight_block_cols;
    }
    out_.push_back({std::move(name), std::move(shape), storage, br, bc});
  }

  void dense(std::string name, int64_t out_dim, int64_t in_dim) {
    add(std::move(name), {out_dim, in_dim}, WeightStorage::kFP8);
  }

  void attention(const std::string& p, const LayerPlan& layer) {
    const int64_t h = c_.hidden_size, d = c_.head_dim, nh = c_.num_attention_heads;
    dense(p + "attn.wq_a.weight", c_.q_lora_rank, h);
    add(p + "attn.q_norm.weight", {c_.q_lora_rank}, WeightStorage::kBF16);
    dense(p + "attn.wq_b.weight", nh * d, c_.q_lora_rank);
    dense(p + "attn.wkv.weight", d, h);
    add(p + "attn.kv_norm.weight", {d}, WeightStorage::kBF16);
    dense(p + "attn.wo_a.weight", int64_t(c_.o_groups) * c_.o_lora_rank, nh * d / c_.o_groups);
    dense(p + "attn.wo_b.weight", h, int64_t(c_.o_groups) * c_.o_lora_rank);
    add(p + "attn.attn_sink", {nh}, WeightStorage::kF32);
    if (c_.is_v41()) {
      v41_compress(p, layer);
    } else {
      v4_compress(p, layer);
    }
  }

  void indexer_queries(const std::string& p) {
    const int64_t hi = c_.index_n_heads;
    dense(p + "attn.indexer.wq_b.weight", hi * c_.index_head_dim, c_.q_lora_rank);
    add(p + "attn.indexer.weights_proj.weight", {hi, c_.hidden_size}, WeightStorage::kBF16);
  }

  void v41_compress(const std::string& p, const LayerPlan& layer) {
    const int64_t h = c_.hidden_size, d = c_.head_dim, di = c_.index_head_dim;
    if (layer.role == LayerRole::kFull) {
      add(p + "attn.compressor.wkv.weight", {d, h}, WeightStorage::kBF16);
      if (layer.ratio > 1) {  // ratio-1 compression is a plain projection, no pooling gate
        add(p + "attn.compressor.wgate.weight", {d, h}, WeightStorage::kBF16);
      }
      add(p + "attn.compressor.norm.weight", {d}, WeightStorage::kBF16);
      add(p + "attn.indexer.wk.weight", {di, d}, WeightStorage::kBF16);
      add(p + "attn.indexer.k_norm.weight", {di}, WeightStorage::kBF16);
    }
    if (layer.role == LayerRole::kFull || layer.role == LayerRole::kReindex) indexer_queries(p);
  }

  void v4_compress(const std::string& p, const LayerPlan& layer) {
    const int64_t d = c_.head_dim, di = c_.index_head_dim;
    if (layer.role == LayerRole::kCsa) {  // overlapped compression: value and score rows are 2*D
      v4_compressor(p + "attn.compressor.", 2 * d, d, 4);
      indexer_queries(p);
      v4_compressor(p + "attn.indexer.compressor.", 2 * di, di, 4);
    } else if (layer.role == LayerRole::kHca) {
      v4_compressor(p + "attn.compressor.", d, d, layer.ratio);
    }
  }

  void v4_compressor(const std::string& p, int64_t width, int64_t norm, int64_t ape_rows) {
    add(p + "wkv.weight", {width, c_.hidden_size}, WeightStorage::kBF16);
    add(p + "wgate.weight", {width, c_.hidden_size}, WeightStorage::kBF16);
    add(p + "ape", {ape_rows, width}, WeightStorage::kF32);
    add(p + "norm.weight", {norm}, WeightStorage::kBF16);
  }

  void expert_matrices(const std::string& p, WeightStorage storage) {
    const int64_t h = c_.hidden_size, inter = c_.moe_intermediate_size;
    add(p + "w1.weight", {inter, h}, storage);
    add(p + "w2.weight", {h, inter}, storage);
    add(p + "w3.weight", {inter, h}, storage);
  }

  void moe(const std::string& p, const LayerPlan& layer) {
    const int64_t e = layer.n_experts;
    add(p + "ffn.gate.weight", {e, c_.hidden_size}, WeightStorage::kBF16);
    if (layer.hash_routed) {
      add(p + "ffn.gate.tid2eid", {c_.vocab_size, layer.experts_per_tok}, WeightStorage::kI64);
    } else {
      add(p + "ffn.gate.bias", {e}, WeightStorage::kF32);
      if (c_.is_v41()) add(p + "ffn.gate.bias_vl", {e}, WeightStorage::kF32);
    }
    expert_matrices(p + "ffn.shared_experts.", WeightStorage::kFP8);
    const WeightStorage expert = c_.expert_fp4 ? WeightStorage::kFP4 : WeightStorage::kFP8;
    for (int64_t x = 0; x < e; ++x) {
      expert_matrices(p + "ffn.experts." + std::to_string(x) + ".", expert);
    }
  }

  void block_common(const LayerPlan& layer) {
    const std::string p = layer.name_prefix();
    const int64_t h = c_.hidden_size;
    add(p + "attn_norm.weight", {h}, WeightStorage::kBF16);
    add(p + "ffn_norm.weight", {h}, WeightStorage::kBF16);
    for (const char* kind : {"attn", "ffn"}) {
      const std::string hc = p + "hc_" + kind;
      add(hc + "_fn", {c_.hc_mix_width(), c_.hc_mult * h}, WeightStorage::kF32);
      add(hc + "_base", {c_.hc_mix_width()}, WeightStorage::kF32);
      add(hc + "_scale", {3}, WeightStorage::kF32);
    }
    attention(p, layer);
    moe(p, layer);
  }

  void engram(const LayerPlan& layer) {
    const EngramSpec& e = *c_.engram;
    const auto at = std::find(e.layer_ids.begin(), e.layer_ids.end(), layer.index);
    const int64_t rows = e.num_embeddings[at - e.layer_ids.begin()];
    const std::string p = layer.name_prefix();
    const int64_t h = c_.hidden_size;
    // Table rows are quantised on their own (1x32 blocks): a gather dequantises single rows.
    add(p + "engram.embed.weight", {rows, e.head_dim}, WeightStorage::kFP8, 1, 32);
    dense(p + "engram.wkv.weight", (c_.hc_mult + 1) * h, e.hash_columns() * e.head_dim);
    add(p + "engram.q_weight", {c_.hc_mult, h}, WeightStorage::kBF16);
    add(p + "engram.k_weight", {c_.hc_mult, h}, WeightStorage::kBF16);
  }

  void drafts() {
    const int64_t h = c_.hidden_size;
    const size_t last = plan_.draft_layers.size() - 1;
    for (const LayerPlan& layer : plan_.draft_layers) {
      block_common(layer);
      const std::string p = layer.name_prefix();
      if (layer.stage == LayerStage::kDspark) {
        const DSparkSpec& d = *c_.dspark;
        if (layer.index == 0) {
          dense(p + "main_proj.weight", h, h * int64_t(d.target_layer_ids.size()));
          add(p + "main_norm.weight", {h}, WeightStorage::kBF16);
        }
        if (size_t(layer.index) == last) {
          const int64_t r = d.markov_rank;
          add(p + "norm.weight", {h}, WeightStorage::kBF16);
          add(p + "markov_head.embed.weight", {c_.vocab_size, r}, WeightStorage::kBF16);
          add(p + "markov_head.head.weight", {c_.vocab_size, r}, WeightStorage::kBF16);
          add(p + "confidence_head.proj.weight", {1, h + r}, WeightStorage::kBF16);
        }
      } else {  // V4 MTP
        dense(p + "e_proj.weight", h, h);
        dense(p + "h_proj.weight", h, h);
        for (const char* n : {"enorm", "hnorm", "norm"}) {
          add(p + n + ".weight", {h}, WeightStorage::kBF16);
        }
        hc_head(p);
      }
    }
  }

  void hc_head(const std::string& p) {
    add(p + "hc_head_fn", {c_.hc_mult, c_.hc_mult * c_.hidden_size}, WeightStorage::kF32);
    add(p + "hc_head_base", {c_.hc_mult}, WeightStorage::kF32);
    add(p + "hc_head_scale", {1}, WeightStorage::kF32);
  }

  const ModelPlan& plan_;
  const ModelConfig& c_;
  std::vector<LogicalTensor> out_;
};

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

DType plain_dtype(WeightStorage s) {
  switch (s) {
    case WeightStorage::kF32:
      return DType::kF32;
    case WeightStorage::kI64:
      return DType::kI64;
    default:
      return DType::kBF16;  // BF16, and FP8/FP4 weights stored unquantised
  }
}

// What the files hold for logical tensor `index`: the weight, then its scales when quantised.
void add_physical(const LogicalTensor& t, size_t index, bool quantized,
                  std::vector<PhysicalTensor>& out) {
  const bool low_precision = t.storage == WeightStorage::kFP8 || t.storage == WeightStorage::kFP4;
  if (!quantized || !low_precision) {
    out.push_back({t.name, plain_dtype(t.storage), t.shape, index, false});
    return;
  }
  const int64_t rows = t.shape[0], cols = t.shape[1];
  if (t.storage == WeightStorage::kFP8) {
    out.push_back({t.name, DType::kFP8E4M3, t.shape, index, false});
    out.push_back({scale_name(t.name), DType::kE8M0,
                   Shape{ceil_div(rows, t.block_rows), ceil_div(cols, t.block_cols)}, index, true});
  } else {
    out.push_back({t.name, DType::kI8, Shape{rows, cols / 2}, index, false});
    out.push_back({scale_name(t.name), DType::kE8M0, Shape{rows, cols / 32}, index, true});
  }
}

template <typename T>
const T* find_by_name(const std::vector<T>& sorted, std::string_view name) {
  const auto it = std::lower_bound(sorted.begin(), sorted.end(), name,
                                   [](const T& t, std::string_view n) { return t.name < n; });
  return it != sorted.end() && it->name == name ? &*it : nullptr;
}

bool is_float(DType d) { return d == DType::kBF16 || d == DType::kF32 || d == DType::kF16; }

}  // namespace

const char* weight_storage_name(WeightStorage storage) noexcept {
  static constexpr const char* kNames[] = {"BF16", "F32", "I64", "fp8", "fp4"};
  return enum_name(storage, kNames, "?");
}

int64_t PhysicalTensor::nbytes() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return bytes_for(dtype, n);
}

const LogicalTensor* TensorSpec::find_logical(std::string_view name) const {
  return find_by_name(logical, name);
}

const PhysicalTensor* TensorSpec::find_physical(std::string_view name) const {
  return find_by_name(physical, name);
}

TensorSpec build_tensor_spec(const ModelPlan& plan) {
  TensorSpec spec;
  spec.quantized = plan.config.quantized;
  spec.logical = SpecBuilder(plan).build();
  for (size_t i = 0; i < spec.logical.size(); ++i) {
    add_physical(spec.logical[i], i, spec.quantized, spec.physical);
  }
  std::sort(spec.physical.begin(), spec.physical.end(),
            [](const PhysicalTensor& a, const PhysicalTensor& b) { return a.name < b.name; });
  return spec;
}

std::string scale_name(std::string_view weight_name) {
  constexpr std::string_view kSuffix = ".weight";
  if (weight_name.size() >= kSuffix.size() &&
      weight_name.substr(weight_name.size() - kSuffix.size()) == kSuffix) {
    weight_name.remove_suffix(kSuffix.size());
  }
  return std::string(weight_name) + ".scale";
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

void append_tensor_problems(const PhysicalTensor& expected, const TensorInfo& found,
                            std::vector<std::string>& problems) {
  const DType want = expected.dtype, got = found.dtype;
  bool ok = got == want;
  std::string allowed = safetensors_name(want);
  if (want == DType::kI64) {
    ok = got == DType::kI64 || got == DType::kI32;
    allowed = "I64 or I32";
  } else if (is_float(want)) {
    ok = is_float(got);
    allowed = "BF16 or F32 or F16";
  }
  if (!ok) {
    problems.push_back("tensor " + expected.name + " has dtype " + safetensors_name(got) +
                       ", expected " + allowed);
  }
  if (found.shape != expected.shape) {
    problems.push_back("tensor " + expected.name + " has shape " + shape_text(found.shape) +
                       ", expected " + shape_text(expected.shape));
  }
}

}  // namespace dsv41rt
