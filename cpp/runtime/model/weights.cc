#include "runtime/model/weights.h"

#include <cstring>

#include "core/dtype.h"
#include "core/status.h"
#include "kernels/quant.h"
#include "runtime/model/synthetic_weights.h"
#include "runtime/model/tensor_spec.h"

namespace dsv41rt::model {
namespace {

namespace k = kernels::cpu;

void decode(const TensorSource& src, float* out);

// A lazy synthetic source's rows: generated codes and the tensor-wide scale, then decoded.
void decode_synthetic(const TensorSource& src, float* out) {
  const SyntheticTensor& t = *src.synthetic;
  const std::vector<uint8_t> codes = synthetic_codes(src);
  const std::vector<uint8_t> scales(size_t(t.scale_bytes(src.rows)), t.scale_byte());
  TensorSource stored = src;
  stored.synthetic.reset();
  stored.data = codes.data();
  stored.scale = scales.data();
  decode(stored, out);
}

void decode(const TensorSource& src, float* out) {
  if (src.lazy()) return decode_synthetic(src, out);
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

// Reads logical tensors by name; their shape, storage and block come from the tensor spec, and
// the stored form is checked against it the way checkpoint validation checks it.
class Loader {
 public:
  Loader(const Checkpoint& ck, const TensorSpec& spec, bool host_values,
         std::shared_ptr<const SyntheticManifest> synthetic)
      : ck_(ck), spec_(spec), host_values_(host_values), synthetic_(std::move(synthetic)) {}

  /// The lazy synthetic tensor `name` (a weight the manifest lists), or null.
  std::shared_ptr<const SyntheticTensor> synthetic(const std::string& name) const {
    const SyntheticTensor* t = synthetic_ ? synthetic_->find(name) : nullptr;
    return t ? SyntheticManifest::entry(synthetic_, *t) : nullptr;
  }

  /// The stored dtype and shape of `name`: the checkpoint's, or the manifest's for a lazy one.
  TensorInfo info(const std::string& name) const {
    std::optional<TensorInfo> listed = synthetic_ ? synthetic_->info(name) : std::nullopt;
    const bool stored = ck_.contains(name);
    DSV41RT_CHECK_CODE(kInvalidArgument, !(listed && stored), ck_.path(), ": tensor ", name,
                       " is both stored in ", stored ? ck_.info(name).file : "", " and listed in ",
                       synthetic_ ? synthetic_->path : "");
    if (listed) return *listed;
    DSV41RT_CHECK_CODE(kNotFound, stored, ck_.path(), ": missing tensor ", name);
    return ck_.info(name);
  }

  /// The stored form of `name` (and of its scales when quantised), checked against the spec.
  const PhysicalTensor& checked(const std::string& name) const {
    const PhysicalTensor* expected = spec_.find_physical(name);
    DSV41RT_CHECK_CODE(kInternal, expected != nullptr, "tensor ", name,
                       " is not in the tensor spec");
    std::vector<std::string> problems;
    append_tensor_problems(*expected, info(name), problems);
    DSV41RT_CHECK(problems.empty(), ck_.path(), ": ", problems.front());
    return *expected;
  }

  /// The logical FP32 tensor `name`, whatever its storage.
  Tensor load(const std::string& name) const {
    const PhysicalTensor& stored = checked(name);
    const LogicalTensor& logical = spec_.logical[stored.logical];
    Tensor t;
    t.shape = logical.shape;
    const int64_t n = t.numel();
    TensorSource& src = t.source;
    src.synthetic = synthetic(name);
    src.dtype = info(name).dtype;
    src.data = src.lazy() ? nullptr : ck_.tensor_data(name);
    src.rows = t.shape.empty() ? 1 : t.shape[0];
    src.cols = src.rows ? n / src.rows : 0;
    if (src.dtype == DType::kFP8E4M3 || src.dtype == DType::kI8) {
      const std::string& scale = checked(scale_name(name)).name;
      DSV41RT_CHECK_CODE(kInvalidArgument, !src.lazy() || src.synthetic->scale == scale,
                         synthetic_->path, " tensor ", name, ": its scale must be ", scale,
                         ", the manifest lists ", src.lazy() ? src.synthetic->scale : "");
      src.scale = src.lazy() ? nullptr : ck_.tensor_data(scale);
      src.block_rows = logical.block_rows;
      src.block_cols = logical.block_cols;
      DSV41RT_CHECK_CODE(
          kInvalidArgument,
          !src.lazy() || (src.synthetic->rows == src.rows && src.synthetic->cols == src.cols &&
                          (!src.synthetic->fp8() || (src.synthetic->block_rows == src.block_rows &&
                                                     src.synthetic->block_cols == src.block_cols))),
          synthetic_->path, " tensor ", name, ": its shape or block differs from the spec's");
    }
    // A lazy synthetic tensor keeps no host values here: the backend generates its rank's rows.
    if (host_values_ && !src.lazy()) {
      t.data.resize(static_cast<size_t>(n));
      decode(src, t.data.data());
    }
    return t;
  }

 private:
  const Checkpoint& ck_;
  const TensorSpec& spec_;
  bool host_values_;
  std::shared_ptr<const SyntheticManifest> synthetic_;
};

// A V4 compressor's tensors: `<q>wkv.weight`, `<q>wgate.weight`, `<q>ape` and `<q>norm.weight`.
void load_compressor(const Loader& L, const std::string& q, Tensor& wkv, Tensor& wgate, Tensor& ape,
                     Tensor& norm) {
  wkv = L.load(q + "wkv.weight");
  wgate = L.load(q + "wgate.weight");
  ape = L.load(q + "ape");
  norm = L.load(q + "norm.weight");
}

// A hyper-connection's mixing parameters: `<name>_fn`, `<name>_base` and `<name>_scale`.
void load_hyper_connection(const Loader& L, const std::string& name, Tensor& fn, Tensor& base,
                           Tensor& scale) {
  fn = L.load(name + "_fn");
  base = L.load(name + "_base");
  scale = L.load(name + "_scale");
}

void load_attention(const Loader& L, const LayerPlan& layer, const std::string& p,
                    AttentionWeights& w) {
  w.wq_a = L.load(p + "attn.wq_a.weight");
  w.q_norm = L.load(p + "attn.q_norm.weight");
  w.wq_b = L.load(p + "attn.wq_b.weight");
  w.wkv = L.load(p + "attn.wkv.weight");
  w.kv_norm = L.load(p + "attn.kv_norm.weight");
  w.wo_a = L.load(p + "attn.wo_a.weight");
  w.wo_b = L.load(p + "attn.wo_b.weight");
  w.attn_sink = L.load(p + "attn.attn_sink");
  if (layer.role == LayerRole::kFull) {
    w.comp_wkv = L.load(p + "attn.compressor.wkv.weight");
    if (layer.ratio > 1) w.comp_wgate = L.load(p + "attn.compressor.wgate.weight");
    w.comp_norm = L.load(p + "attn.compressor.norm.weight");
    w.idx_wk = L.load(p + "attn.indexer.wk.weight");
    w.idx_k_norm = L.load(p + "attn.indexer.k_norm.weight");
  }
  if (layer.role == LayerRole::kCsa || layer.role == LayerRole::kHca) {  // V4
    load_compressor(L, p + "attn.compressor.", w.comp_wkv, w.comp_wgate, w.comp_ape, w.comp_norm);
  }
  if (layer.role == LayerRole::kCsa) {
    load_compressor(L, p + "attn.indexer.compressor.", w.idx_comp_wkv, w.idx_comp_wgate,
                    w.idx_comp_ape, w.idx_comp_norm);
  }
  if (layer.owns_indexer()) {
    w.idx_wq_b = L.load(p + "attn.indexer.wq_b.weight");
    w.idx_weights_proj = L.load(p + "attn.indexer.weights_proj.weight");
  }
}

// V4 hash routing's table [vocab, k] (I64 or I32 as stored), every entry an expert id: a bad
// entry would index outside the expert stack at run time, so it is refused here, by position.
std::vector<int32_t> load_tid2eid(const Checkpoint& ck, const Loader& L, const std::string& name,
                                  int64_t experts) {
  L.checked(name);
  const TensorInfo& info = ck.info(name);
  int64_t n = 1;
  for (int64_t d : info.shape) n *= d;
  const uint8_t* data = ck.tensor_data(name);
  std::vector<int32_t> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    int64_t v = 0;
    if (info.dtype == DType::kI64) {
      std::memcpy(&v, data + i * 8, 8);
    } else {
      int32_t v32 = 0;
      std::memcpy(&v32, data + i * 4, 4);
      v = v32;
    }
    DSV41RT_CHECK(v >= 0 && v < experts, ck.path(), ": ", name, " element ", i, " (token ",
                  i / info.shape.back(), ") is expert ", v, ", outside [0, ", experts, ")");
    out[size_t(i)] = int32_t(v);
  }
  return out;
}

void load_moe(const Checkpoint& ck, const Loader& L, const LayerPlan& layer, const std::string& p,
              MoeWeights& w) {
  w.gate = L.load(p + "ffn.gate.weight");
  if (layer.hash_routed) {
    w.tid2eid = load_tid2eid(ck, L, p + "ffn.gate.tid2eid", layer.n_experts);
  } else {
    w.bias = L.load(p + "ffn.gate.bias");
  }
  for (int e = 0; e < layer.n_experts; ++e) {
    const std::string q = p + "ffn.experts." + std::to_string(e) + ".";
    w.w1.push_back(L.load(q + "w1.weight"));
    w.w2.push_back(L.load(q + "w2.weight"));
    w.w3.push_back(L.load(q + "w3.weight"));
  }
  w.shared_w1 = L.load(p + "ffn.shared_experts.w1.weight");
  w.shared_w2 = L.load(p + "ffn.shared_experts.w2.weight");
  w.shared_w3 = L.load(p + "ffn.shared_experts.w3.weight");
}

// The table stays in the mapped file (rows are dequantised on gather), so it must be stored in
// the release's FP8 form.
EngramWeights load_engram(const Checkpoint& ck, const Loader& L, const std::string& p) {
  EngramWeights w;
  const std::string table = p + "engram.embed.weight";
  const PhysicalTensor& stored = L.checked(table);
  DSV41RT_CHECK_CODE(kUnsupported, stored.dtype == DType::kFP8E4M3, ck.path(), ": Engram table ",
                     table, " is stored ", safetensors_name(L.info(table).dtype),
                     " (BF16 Engram tables are not supported yet)");
  w.rows = stored.shape[0];
  const std::string& scale = L.checked(scale_name(table)).name;
  w.synthetic = L.synthetic(table);
  if (w.synthetic) {
    // Kept whole by every rank, generated whole by the backend (or materialize_host_values).
    DSV41RT_CHECK_CODE(kInvalidArgument, w.synthetic->scale == scale, table, ": its scale must be ",
                       scale, ", the manifest lists ", w.synthetic->scale);
  } else {
    w.table = ck.tensor_data(table);
    w.table_scale = ck.tensor_data(scale);
  }
  w.wkv = L.load(p + "engram.wkv.weight");
  w.q_weight = L.load(p + "engram.q_weight");
  w.k_weight = L.load(p + "engram.k_weight");
  return w;
}

BlockWeights load_block(const Checkpoint& ck, const Loader& L, const LayerPlan& layer) {
  const std::string p = layer.name_prefix();
  BlockWeights b;
  b.attn_norm = L.load(p + "attn_norm.weight");
  b.ffn_norm = L.load(p + "ffn_norm.weight");
  load_hyper_connection(L, p + "hc_attn", b.hc_attn_fn, b.hc_attn_base, b.hc_attn_scale);
  load_hyper_connection(L, p + "hc_ffn", b.hc_ffn_fn, b.hc_ffn_base, b.hc_ffn_scale);
  load_attention(L, layer, p, b.attn);
  load_moe(ck, L, layer, p, b.moe);
  if (layer.engram) b.engram = load_engram(ck, L, p);
  return b;
}

// The DSpark stages and their heads, or V4's MTP layer with its projections, norms and
// hyper-head (names as tensor_spec.cc drafts() lists them).
DraftWeights load_drafts(const Checkpoint& ck, const Loader& L, const ModelPlan& plan) {
  DSV41RT_CHECK_CODE(kUnsupported, !plan.draft_layers.empty(), ck.path(),
                     ": the config has no draft stages (num_nextn_predict_layers = 0) to load");
  DraftWeights d;
  for (const LayerPlan& layer : plan.draft_layers) d.stages.push_back(load_block(ck, L, layer));
  const std::string first = plan.draft_layers.front().name_prefix();
  const std::string last = plan.draft_layers.back().name_prefix();
  d.norm = L.load(last + "norm.weight");
  if (!plan.config.dspark) {  // V4 MTP (spec 4.3): one layer, mtp.0
    d.e_proj = L.load(first + "e_proj.weight");
    d.h_proj = L.load(first + "h_proj.weight");
    d.enorm = L.load(first + "enorm.weight");
    d.hnorm = L.load(first + "hnorm.weight");
    load_hyper_connection(L, first + "hc_head", d.hc_head_fn, d.hc_head_base, d.hc_head_scale);
    return d;
  }
  d.main_proj = L.load(first + "main_proj.weight");
  d.main_norm = L.load(first + "main_norm.weight");
  d.markov_embed = L.load(last + "markov_head.embed.weight");
  d.markov_head = L.load(last + "markov_head.head.weight");
  d.confidence = L.load(last + "confidence_head.proj.weight");
  return d;
}

}  // namespace

bool bf16_exact(const Tensor& t) {
  const DType d = t.source.dtype;
  return d == DType::kFP8E4M3 || d == DType::kI8 || d == DType::kBF16;
}

bool fp8_input(const Tensor& t) {
  const DType d = t.source.dtype;
  return d == DType::kFP8E4M3 || d == DType::kI8;
}

std::vector<float> host_values(const Tensor& t) {
  if (!t.data.empty() || (t.source.data == nullptr && !t.source.lazy())) return t.data;
  std::vector<float> out(size_t(t.numel()));
  decode(t.source, out.data());
  return out;
}

ModelWeights load_weights(std::shared_ptr<Checkpoint> checkpoint, const ModelPlan& plan,
                          bool host_values, const std::function<void(int64_t, int64_t)>& progress,
                          bool drafts, std::shared_ptr<const SyntheticManifest> synthetic) {
  const ModelConfig& c = plan.config;
  const TensorSpec spec = build_tensor_spec(plan);
  Loader L(*checkpoint, spec, host_values, std::move(synthetic));
  ModelWeights w;
  w.checkpoint = checkpoint;
  // A BF16 embedding stays in the mapped file (rows are decoded on gather).
  if (L.info(L.checked("embed.weight").name).dtype == DType::kBF16) {
    w.embed_bf16 = reinterpret_cast<const uint16_t*>(checkpoint->tensor_data("embed.weight"));
  } else {
    w.embed = L.load("embed.weight");
  }
  w.head = L.load("head.weight");
  w.norm = L.load("norm.weight");
  if (!c.is_v41()) {
    load_hyper_connection(L, "hc_head", w.hc_head_fn, w.hc_head_base, w.hc_head_scale);
  }
  for (const LayerPlan& layer : plan.layers) {
    w.layers.push_back(load_block(*checkpoint, L, layer));
    if (progress) progress(int64_t(w.layers.size()), int64_t(plan.layers.size()));
  }
  if (drafts) w.drafts = load_drafts(*checkpoint, L, plan);
  return w;
}

namespace {

// The stored bytes of rows [begin, begin + n) of `s` (a view into the checkpoint): row-major
// codes, and for FP8 the scale-block rows they fall in (begin and n whole blocks), for packed FP4
// their per-row scales.
TensorSource source_rows(const TensorSource& s, const char* what, int64_t begin, int64_t n) {
  TensorSource out = s;
  out.rows = n;
  if (!s.data && !s.lazy()) return out;
  DSV41RT_CHECK_CODE(
      kInvalidArgument,
      s.dtype != DType::kFP8E4M3 || (begin % s.block_rows == 0 && n % s.block_rows == 0),
      "tensor_shard: ", what, " rows [", begin, ", ", begin + n, ") do not fall on its ",
      s.block_rows, "-row scale blocks");
  // A lazy synthetic source: the same rows of the generated tensor (generated where kept).
  if (s.lazy()) {
    out.synthetic_row = s.synthetic_row + begin;
    return out;
  }
  switch (s.dtype) {
    case DType::kFP8E4M3: {
      out.data = s.data + begin * s.cols;
      out.scale = s.scale + (begin / s.block_rows) * ((s.cols + s.block_cols - 1) / s.block_cols);
      break;
    }
    case DType::kI8:  // packed FP4: two codes per byte, one UE8M0 scale per 32 columns
      out.data = s.data + begin * (s.cols / 2);
      out.scale = s.scale + begin * ((s.cols + 31) / 32);
      break;
    default:
      out.data = s.data + bytes_for(s.dtype, begin * s.cols);
  }
  return out;
}

// Rows [rank * n / size, (rank + 1) * n / size) of a [n, ...] tensor: its host values when it
// has them, and its stored bytes (what a device backend uploads) either way.
Tensor row_share(const Tensor& t, const char* what, int rank, int size) {
  DSV41RT_CHECK_CODE(kInternal, !t.empty() && !t.shape.empty(), "tensor_shard: ", what,
                     " is not loaded");
  const int64_t n = t.shape[0], per = n / size, row = t.numel() / n;
  Tensor out;
  out.shape = t.shape;
  out.shape[0] = per;
  if (!t.data.empty()) {
    out.data.assign(t.data.begin() + rank * per * row, t.data.begin() + (rank + 1) * per * row);
  }
  // The stored form decides the GEMM inputs, as unsplit.
  out.source = source_rows(t.source, what, rank * per, per);
  out.whole_rows = t.whole_rows > 0 ? t.whole_rows : n;
  return out;
}

}  // namespace

ModelWeights tensor_shard(ModelWeights all, const ModelPlan& plan, int rank, int size) {
  const ModelConfig& c = plan.config;
  DSV41RT_CHECK_CODE(kInvalidArgument, size >= 1 && rank >= 0 && rank < size,
                     "tensor-parallel rank ", rank, " of ", size);
  auto divides = [&](int64_t n, const char* what) {
    DSV41RT_CHECK_CODE(kInvalidArgument, n % size == 0, "tensor_parallel_size ", size,
                       " does not divide the ", n, " ", what);
  };
  divides(c.num_attention_heads, "attention heads");
  divides(c.vocab_size, "vocabulary rows of the head");
  // More ranks than output groups: wo_a stays whole (the ranks gather the heads' outputs).
  const bool split_groups = c.o_groups % size == 0;
  ModelWeights out = std::move(all);
  // The drafter reads the whole head and runs unsharded (not under tensor parallelism yet).
  out.drafts.reset();
  out.head = row_share(out.head, "head.weight", rank, size);
  for (BlockWeights& b : out.layers) {
    b.attn.wq_b = row_share(b.attn.wq_b, "attn.wq_b", rank, size);
    b.attn.attn_sink = row_share(b.attn.attn_sink, "attn.attn_sink", rank, size);
    if (split_groups) b.attn.wo_a = row_share(b.attn.wo_a, "attn.wo_a", rank, size);
  }
  return out;
}

ModelWeights expert_shard(const ModelWeights& all, const ModelPlan& plan, int rank, int size) {
  DSV41RT_CHECK_CODE(kInvalidArgument, size >= 1 && rank >= 0 && rank < size,
                     "expert-parallel rank ", rank, " of ", size);
  ModelWeights out;
  out.checkpoint = all.checkpoint;
  out.embed = all.embed, out.embed_bf16 = all.embed_bf16, out.head = all.head, out.norm = all.norm;
  out.hc_head_fn = all.hc_head_fn, out.hc_head_base = all.hc_head_base;  // V4's hyper-head
  out.hc_head_scale = all.hc_head_scale;
  out.layers.reserve(plan.layers.size());
  for (size_t li = 0; li < plan.layers.size(); ++li) {
    const BlockWeights& b = all.layers[li];
    const int64_t E = plan.layers[li].n_experts;
    DSV41RT_CHECK_CODE(kInvalidArgument, E % size == 0, "expert_parallel_size ", size,
                       " does not divide the ", E, " routed experts of layer ", li);
    DSV41RT_CHECK_CODE(kInternal, b.moe.expert_begin == 0 && int64_t(b.moe.w1.size()) == E,
                       "expert_shard: layer ", li, " is already a shard");
    // The replicated parts are copied (views when loaded without host values), the routed
    // experts only for this rank's share: the others are never copied.
    const int64_t per = E / size, begin = rank * per;
    auto share = [&](const std::vector<Tensor>& w) {
      return std::vector<Tensor>(w.begin() + begin, w.begin() + begin + per);
    };
    const MoeWeights& m = b.moe;
    MoeWeights moe{m.gate,      m.bias, m.tid2eid,   share(m.w1), share(m.w2),
                   share(m.w3), begin,  m.shared_w1, m.shared_w2, m.shared_w3};
    out.layers.push_back(BlockWeights{b.attn_norm, b.ffn_norm, b.hc_attn_fn, b.hc_attn_base,
                                      b.hc_attn_scale, b.hc_ffn_fn, b.hc_ffn_base, b.hc_ffn_scale,
                                      b.attn, std::move(moe), b.engram});
  }
  return out;
}

}  // namespace dsv41rt::model

namespace dsv41rt::model {

std::vector<uint8_t> synthetic_codes(const TensorSource& s) {
  DSV41RT_CHECK_CODE(kInternal, s.lazy(), "synthetic_codes: not a lazy synthetic source");
  const SyntheticTensor& t = *s.synthetic;
  std::vector<uint8_t> codes(size_t(s.rows * t.row_bytes()));
  generate_synthetic_rows(t, s.synthetic_row, s.synthetic_row + s.rows, codes.data());
  return codes;
}

namespace {

template <typename F>
void for_each_tensor(BlockWeights& b, const F& f) {
  for (Tensor* t : {&b.attn_norm, &b.ffn_norm, &b.hc_attn_fn, &b.hc_attn_base, &b.hc_attn_scale,
                    &b.hc_ffn_fn, &b.hc_ffn_base, &b.hc_ffn_scale}) {
    f(*t);
  }
  AttentionWeights& a = b.attn;
  for (Tensor* t : {&a.wq_a,
                    &a.q_norm,
                    &a.wq_b,
                    &a.wkv,
                    &a.kv_norm,
                    &a.wo_a,
                    &a.wo_b,
                    &a.attn_sink,
                    &a.comp_wkv,
                    &a.comp_wgate,
                    &a.comp_norm,
                    &a.idx_wq_b,
                    &a.idx_weights_proj,
                    &a.idx_wk,
                    &a.idx_k_norm,
                    &a.comp_ape,
                    &a.idx_comp_wkv,
                    &a.idx_comp_wgate,
                    &a.idx_comp_ape,
                    &a.idx_comp_norm}) {
    f(*t);
  }
  MoeWeights& m = b.moe;
  for (Tensor* t : {&m.gate, &m.bias, &m.shared_w1, &m.shared_w2, &m.shared_w3}) f(*t);
  for (std::vector<Tensor>* ts : {&m.w1, &m.w2, &m.w3}) {
    for (Tensor& t : *ts) f(t);
  }
  if (b.engram) {
    for (Tensor* t : {&b.engram->wkv, &b.engram->q_weight, &b.engram->k_weight}) f(*t);
  }
}

}  // namespace

int64_t materialize_host_values(ModelWeights& w) {
  int64_t bytes = 0;
  auto values = [&](Tensor& t) {
    if (!t.data.empty() || !t.source.lazy()) return;
    t.data = host_values(t);
    bytes += t.source.rows * t.source.synthetic->row_bytes();
  };
  for (Tensor* t : {&w.embed, &w.head, &w.norm, &w.hc_head_fn, &w.hc_head_base, &w.hc_head_scale}) {
    values(*t);
  }
  auto block = [&](BlockWeights& b) {
    for_each_tensor(b, values);
    if (b.engram && b.engram->synthetic && !b.engram->generated) {
      EngramWeights& e = *b.engram;
      const SyntheticTensor& t = *e.synthetic;
      auto all = std::make_shared<std::vector<uint8_t>>(
          size_t(t.rows * t.row_bytes() + t.scale_bytes(t.rows)), t.scale_byte());
      generate_synthetic_rows(t, 0, t.rows, all->data());
      bytes += t.rows * t.row_bytes();
      e.table = all->data();
      e.table_scale = all->data() + t.rows * t.row_bytes();
      e.generated = std::move(all);
    }
  };
  for (BlockWeights& b : w.layers) block(b);
  if (w.drafts) {
    for (BlockWeights& b : w.drafts->stages) block(b);
    DraftWeights& d = *w.drafts;
    for (Tensor* t : {&d.main_proj, &d.main_norm, &d.norm, &d.markov_embed, &d.markov_head,
                      &d.confidence, &d.e_proj, &d.h_proj, &d.enorm, &d.hnorm, &d.hc_head_fn,
                      &d.hc_head_base, &d.hc_head_scale}) {
      values(*t);
    }
  }
  return bytes;
}

}  // namespace dsv41rt::model
