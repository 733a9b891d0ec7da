#include "runtime/model/cuda_executor.h"

#include <algorithm>
#include <cmath>

#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/compressor.cuh"
#include "kernels/cuda/engram.cuh"
#include "kernels/cuda/gemm_tc.cuh"
#include "kernels/cuda/indexer.cuh"
#include "kernels/cuda/linear.cuh"
#include "kernels/cuda/mhc.cuh"
#include "kernels/cuda/moe.cuh"
#include "kernels/cuda/moe_grouped.cuh"
#include "kernels/cuda/paged.cuh"
#include "kernels/cuda/quant.cuh"
#include "kernels/cuda/rms_norm.cuh"
#include "kernels/cuda/rope.cuh"
#include "kernels/rope.h"
#include "runtime/model/cuda_resources.h"
#include "runtime/model/cuda_weights.h"
#include "runtime/model/forward_plan.h"

namespace dsv41rt::model {

namespace kc = kernels::cuda;
using cudart::DeviceArray;
using kc::RowFormat;

namespace {

int parse_device(const std::string& d) {
  int index = 0;
  if (d != "cuda") {
    const std::string n = d.substr(5);
    DSV41RT_CHECK(!n.empty() && n.find_first_not_of("0123456789") == std::string::npos, "device '",
                  d, "': expected 'cuda' or 'cuda:N'");
    index = std::stoi(n);
  }
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  DSV41RT_CHECK_CODE(kUnsupported, e == cudaSuccess && index < count, "device '", d,
                     "': no such CUDA device (", e == cudaSuccess ? count : 0, " visible",
                     e == cudaSuccess ? "" : std::string(", ") + cudaGetErrorString(e), ")");
  return index;
}

// Dispatch on the weight's device precision (both kernels give the same results).
cudaError_t lin_fp32(const float* x, DevMatrix w, int64_t m, int64_t k, int64_t n, float* y,
                     bool accumulate, cudaStream_t s) {
  return w.bf16
             ? kc::linear_bf16w(x, static_cast<const uint16_t*>(w.ptr), m, k, n, y, accumulate, s)
             : kc::linear(x, static_cast<const float*>(w.ptr), m, k, n, y, accumulate, s);
}

cudaError_t grouped_lin_fp32(const float* x, DevMatrix w, int64_t m, int64_t g, int64_t k,
                             int64_t n, float* y, cudaStream_t s) {
  return w.bf16 ? kc::grouped_linear_bf16w(x, static_cast<const uint16_t*>(w.ptr), m, g, k, n, y, s)
                : kc::grouped_linear(x, static_cast<const float*>(w.ptr), m, g, k, n, y, s);
}

// The FP32 MoE: split kernels (every SM busy at decode sizes) when weights are BF16 and a
// workspace is given, else the per-token kernel. Both compute bitwise the same values.
cudaError_t moe_experts_fp32(const float* x, const int32_t* idx, const float* weight, int64_t S,
                             int64_t H, int64_t k, int64_t E, int64_t I, const CudaLayerWeights& w,
                             float limit, float* y, float* work, int64_t work_floats,
                             cudaStream_t s) {
  auto b = [](DevMatrix m) { return static_cast<const uint16_t*>(m.ptr); };
  auto f = [](DevMatrix m) { return static_cast<const float*>(m.ptr); };
  if (w.w1.bf16 && work != nullptr) {
    return kc::moe_forward_split_bf16w(x, idx, weight, S, H, k, E, I, b(w.w1), b(w.w3), b(w.w2),
                                       b(w.shared_w1), b(w.shared_w3), b(w.shared_w2), I, limit, y,
                                       work, work_floats, s);
  }
  if (w.w1.bf16) {
    return kc::moe_forward_bf16w(x, idx, weight, S, H, k, E, I, b(w.w1), b(w.w3), b(w.w2),
                                 b(w.shared_w1), b(w.shared_w3), b(w.shared_w2), I, limit, y, s);
  }
  return kc::moe_forward(x, idx, weight, S, H, k, E, I, f(w.w1), f(w.w3), f(w.w2), f(w.shared_w1),
                         f(w.shared_w3), f(w.shared_w2), I, limit, y, s);
}

void sorted_rows(const std::vector<int32_t>& src, int64_t rows, int64_t k,
                 std::vector<int32_t>& dst) {
  const size_t at = dst.size();
  dst.insert(dst.end(), src.begin(), src.begin() + rows * k);
  for (int64_t r = 0; r < rows; ++r) {
    std::sort(dst.begin() + at + r * k, dst.begin() + at + (r + 1) * k);
  }
}

class CudaExecutor final : public Executor {
 public:
  CudaExecutor(ModelPlan plan, ModelWeights weights, EngramTables engram, ExecutorOptions options)
      : plan_(std::move(plan)), engram_(std::move(engram)), options_(std::move(options)) {
    device_ = parse_device(options_.device);
    bf16_gemm_ = options_.precision == "bf16";
    DSV41RT_CU(cudaSetDevice(device_));
    const ModelConfig& c = plan_.config;
    if (c.engram) {
      DSV41RT_CHECK(engram_.layers.size() == c.engram->layer_ids.size(), c.source,
                    ": Engram tables for ", engram_.layers.size(), " layers, config has ",
                    c.engram->layer_ids.size());
      DSV41RT_CHECK(int64_t(engram_.token_map.size()) == c.vocab_size, c.source,
                    ": Engram token map has ", engram_.token_map.size(), " entries, vocab is ",
                    c.vocab_size);
    }
    std::vector<std::vector<float>> inv_freq;
    for (const LayerPlan& layer : plan_.layers) {
      kernels::cpu::YarnParams yarn;
      const kernels::cpu::YarnParams* yp = nullptr;
      if (layer.yarn && c.yarn) {
        yarn.factor = c.yarn->factor;
        yarn.original_max_position = c.yarn->original_max_position;
        yarn.beta_fast = c.yarn->beta_fast;
        yarn.beta_slow = c.yarn->beta_slow;
        yp = &yarn;
      }
      inv_freq.push_back(kernels::cpu::rope_inv_freq(c.qk_rope_head_dim, layer.rope_base, yp));
    }
    weights_ = upload_weights(plan_, weights, inv_freq);
    layout_ = make_state_layout(plan_, options_);
    memory_ = plan_memory(plan_, *layout_, options_);
    const engine::PoolGeometry g = layout_->geometry();
    auto device_bytes = [](int64_t bytes) {
      return std::static_pointer_cast<uint8_t>(cudart::device_alloc(bytes));
    };
    pool_ = std::make_unique<engine::KvPool>(engine::KvPool::from_budget(
        g, memory_.num_slots * g.slot_bytes + memory_.num_pages * g.page_bytes, memory_.num_slots,
        device_bytes));
    slot_base_ = pool_->slot_data(0);
    histories_.assign(size_t(memory_.num_slots * std::max<int64_t>(layout_->history_len(), 1)), 0);
    workspaces_ = DequantWorkspaces([](int64_t bytes) { return cudart::device_alloc(bytes); });
    const bool q = options_.cache_quant;
    window_fmt_ = q ? RowFormat::kFp8Window : RowFormat::kF32;
    kv_fmt_ = q ? RowFormat::kNvfp4 : RowFormat::kF32;
    key_fmt_ = q ? RowFormat::kMxfp4 : RowFormat::kF32;
    st_ = std::make_unique<Streams>();
  }

  ~CudaExecutor() override { cudaDeviceSynchronize(); }

  void forward(std::vector<BatchItem>& batch) override { forward_impl(batch, nullptr); }
  void forward_cp(std::vector<BatchItem>& batch, comm::Communicator& comm) override {
    forward_impl(batch, &comm);
  }
  void copy_state(const RequestView& src, const RequestView& dst) override {
    check_copy_state(*pool_, src, dst);
    DSV41RT_CU(cudaSetDevice(device_));
    const engine::PoolGeometry& g = pool_->geometry();
    DSV41RT_CU(cudaMemcpyAsync(dst.slot, src.slot, g.slot_bytes, cudaMemcpyDeviceToDevice, main()));
    for (int64_t i = 0; i < pool_->pages_for(src.length); ++i) {
      DSV41RT_CU(cudaMemcpyAsync(pool_->page_data(dst.pages[i]), pool_->page_data(src.pages[i]),
                                 g.page_bytes, cudaMemcpyDeviceToDevice, main()));
    }
    DSV41RT_CU(cudaStreamSynchronize(main()));
    // The host mirror of the Engram history lives outside the slot.
    const int64_t hist = std::max<int64_t>(layout_->history_len(), 1);
    const int32_t* from = history_of(src.slot);
    std::copy(from, from + hist, history_of(dst.slot));
  }

  const ModelPlan& plan() const override { return plan_; }
  const StateLayout& layout() const override { return *layout_; }
  engine::KvPool& pool() override { return *pool_; }
  const MemoryPlan& memory_plan() const override { return memory_; }
  const std::map<std::string, std::vector<int32_t>>& decisions() const override {
    return decisions_;
  }
  DequantWorkspaces& workspaces() override { return workspaces_; }
  std::string device() const override { return "cuda:" + std::to_string(device_); }
  void set_backend_option(const std::string& name, bool on) override {
    if (name == "multistream") {
      options_.multistream = on;
      graphs_.clear();  // captured graphs bake in the stream layout
    } else if (name == "cuda_graphs") {
      options_.cuda_graphs = on;
    } else if (name == "cp_timing") {
      cp_timing_ = on;
    } else if (name == "bf16_gemm") {
      bf16_gemm_ = on;
      graphs_.clear();  // captured graphs bake in the kernels
    } else {
      Executor::set_backend_option(name, on);
    }
  }
  std::map<std::string, int64_t> backend_stats() const override {
    return {{"weight_bytes", weights_.bytes},
            {"eager_forwards", eager_forwards_},
            {"last_forward_us", last_forward_us_},
            {"graph_captures", captures_},
            {"graph_replays", replays_},
            {"graphs", int64_t(graphs_.size())},
            {"multistream", options_.multistream ? 1 : 0},
            {"cuda_graphs", options_.cuda_graphs ? 1 : 0},
            {"bf16_gemm", bf16_gemm_ ? 1 : 0},
            {"cp_layers_timed", cp_layers_},
            {"cp_q_projection_us", cp_q_us_},
            {"cp_all_gather_us", cp_gather_us_},
            {"cp_overlap_us", cp_overlap_us_}};
  }

 private:
  // Decode graphs, one per bucket; valid while no buffer they bake in has moved.
  struct Graph {
    cudaGraphExec_t exec = nullptr;
    uint64_t generation = 0, ws_generation = 0;
    const uint8_t* meta_base = nullptr;
    DequantCounters delta;  // the acquires of one captured forward
    ~Graph() {
      if (exec) cudaGraphExecDestroy(exec);
    }
  };
  // Device addresses of the uploaded plan.
  struct Meta {
    const int32_t *tokens, *row_item, *page_table;
    const int64_t *positions, *length, *window_first, *old_count, *old_offset, *row0, *head_rows;
    const float* pre0;  // [rows, hc] one-hot(0): block 0 reads stream 0 (the embedding)
    const uint8_t* store_window;
    uint8_t* const* slots;
    struct Ratio {
      const int64_t *count, *comp_offset, *n_visible, *key_offset;
      const int32_t *group_item, *left_item;
      const int64_t *group_pending, *group_first, *group_entry, *group_position, *left_src,
          *left_dst;
    };
    std::map<int, Ratio> ratio;
    std::vector<const int64_t*> engram_rows;
    // Query rows: this rank's under context parallelism (QueryRows), every row otherwise (then
    // these alias the arrays above).
    int64_t nq = 0;
    const int32_t *q_tokens, *q_row_item;
    const int64_t* q_positions;
    struct QRatio {
      const int64_t *n_visible, *key_offset;
    };
    std::map<int, QRatio> q_ratio;
    std::vector<const int64_t*> q_engram_rows;
    const int64_t* cp_src_row = nullptr;  // [rows] all-gather slot of each plan row
  };

  void upload(const ForwardPlan& f, const QueryRows* q);
  void begin(const ForwardPlan& f, const QueryRows* q = nullptr);
  void forward_impl(std::vector<BatchItem>& batch, comm::Communicator* comm);
  // Context parallelism: local rows [nq, dim] -> plan rows [rows, dim] (one all-gather).
  void gather_rows(const float* local, int64_t dim, int64_t rows, float* out, cudaStream_t s);
  std::unique_ptr<Graph> capture(const ForwardPlan& f);
  bool graph_valid(const Graph* g) const {
    return g && g->generation == generation_ &&
           g->ws_generation == workspaces_.storage_generation() && g->meta_base == meta_up_.base();
  }
  void run(const ForwardPlan& f);
  void attention(const LayerPlan& layer, const CudaLayerWeights& w, const ForwardPlan& f);
  void compressor(const LayerPlan& layer, const CudaLayerWeights& w, const ForwardPlan& f,
                  const float* x, cudaStream_t s);
  void indexer(const LayerPlan& layer, const CudaLayerWeights& w, const ForwardPlan& f,
               cudaStream_t s);
  kc::PagedRows paged(int source_layer, bool key, const ForwardPlan& f) const;
  cudaStream_t side(int i) const { return options_.multistream ? st_->side[i].get() : main(); }
  cudaStream_t main() const { return st_->main.get(); }
  // GEMM dispatch. precision "bf16": BF16 tensor cores (activations rounded to BF16) in forwards
  // of more than kFp32MaxRows rows; smaller ones (decode of a few requests) are weight-bandwidth
  // bound and keep the FP32 kernels. The choice is per forward (use_tc_, set from the unpadded
  // row count) and the threshold sits on a power-of-two boundary, so a decode graph bucket
  // (items padded to a power of two) never straddles it: graph == eager holds in both modes.
  static constexpr int64_t kFp32MaxRows = 8;
  bool tensor_cores(DevMatrix w, int64_t /*m*/) const { return use_tc_ && w.bf16; }
  cudaError_t lin(const float* x, DevMatrix w, int64_t m, int64_t k, int64_t n, float* y,
                  bool accumulate, cudaStream_t s) const {
    if (!tensor_cores(w, m)) return lin_fp32(x, w, m, k, n, y, accumulate, s);
    kc::TcGemm g;
    g.a = x, g.lda = k, g.b = static_cast<const uint16_t*>(w.ptr), g.ldb = k, g.c = y, g.ldc = n;
    g.m = m, g.n = n, g.k = k, g.accumulate = accumulate;
    return kc::gemm_bf16_tc(g, s);
  }
  // x [m, groups, k], w [groups, n, k] -> y [m, groups, n].
  cudaError_t grouped_lin(const float* x, DevMatrix w, int64_t m, int64_t groups, int64_t k,
                          int64_t n, float* y, cudaStream_t s) const {
    if (!tensor_cores(w, m)) return grouped_lin_fp32(x, w, m, groups, k, n, y, s);
    kc::TcGemm g;
    g.a = x, g.lda = groups * k, g.b = static_cast<const uint16_t*>(w.ptr), g.ldb = k;
    g.c = y, g.ldc = groups * n, g.m = m, g.n = n, g.k = k;
    g.batch = groups, g.stride_a = k, g.stride_b = n * k, g.stride_c = n;
    return kc::gemm_bf16_tc(g, s);
  }
  void moe_experts(const float* x, const int32_t* idx, const float* weight, int64_t N, int64_t E,
                   int64_t k, const CudaLayerWeights& w, float* y, cudaStream_t s);
  int32_t* history(const BatchItem& b) { return history_of(b.request.slot); }
  int32_t* history_of(const uint8_t* slot_data) {
    const int64_t slot = (slot_data - slot_base_) / pool_->geometry().slot_bytes;
    return histories_.data() + slot * std::max<int64_t>(layout_->history_len(), 1);
  }

  ModelPlan plan_;
  EngramTables engram_;
  ExecutorOptions options_;
  int device_ = 0;
  CudaModelWeights weights_;
  std::unique_ptr<StateLayout> layout_;
  MemoryPlan memory_;
  std::unique_ptr<engine::KvPool> pool_;
  const uint8_t* slot_base_ = nullptr;
  std::vector<int32_t> histories_;  // host mirror of every slot's Engram history
  DequantWorkspaces workspaces_;
  std::map<std::string, std::vector<int32_t>> decisions_;
  RowFormat window_fmt_, kv_fmt_, key_fmt_;

  // Created after the device check (a CUDA call before it would fail with a driver message).
  struct Streams {
    cudart::Stream main;
    cudart::Stream side[3];  // 0 window store, 1 compressor, 2 indexer
    cudart::Event fork, qr, kv, store, comp, idx;
    cudart::TimingEvent t0, t1;  // brackets each forward on the main stream
  };
  std::unique_ptr<Streams> st_;
  cudart::MetaUpload meta_up_;
  Meta meta_{};
  uint64_t generation_ = 0;  // bumps whenever a buffer moves
  int64_t eager_forwards_ = 0;

  // Activations (grown on demand).
  DeviceArray<float> X_, X1_, u_, xn_, yv_, pre_, a_pre_, a_post_, a_comb_, f_pre_, f_post_,
      f_comb_;
  DeviceArray<float> qr_, q_, kv_a_, o_, z_, cv_, cs_, ikeys_new_, qi_, wts_, ikeys_, scores_;
  DeviceArray<uint8_t> mask_;
  DeviceArray<int32_t> topk_, idx_, moe_idx_;
  DeviceArray<float> moe_w_, emb_, engram_ws_, hsel_, logits_;
  DeviceArray<float> moe_work_;    // MoE scratch: split-kernel hidden units or grouped GEMMs
  DeviceArray<int32_t> moe_ints_;  // grouped MoE: counts, permutation, tile table
  bool bf16_gemm_ = false;
  // Context parallelism, set for the duration of a forward_cp.
  comm::Communicator* comm_ = nullptr;
  QueryRows qv_;
  DeviceArray<float> cp_recv_, xg_, ug_;
  std::vector<float> cp_host_;  // staging of host communicators
  // CP timing (backend option "cp_timing"): per layer, events around the Q projection (side
  // stream) and the all-gather (main stream), read after the forward.
  bool cp_timing_ = false;
  std::vector<std::unique_ptr<cudart::TimingEvent>> cp_events_;
  int64_t cp_layer_ = 0;
  int64_t cp_q_us_ = 0, cp_gather_us_ = 0, cp_overlap_us_ = 0, cp_layers_ = 0;
  void cp_mark(int i, cudaStream_t s) {
    if (!cp_timing_) return;
    const size_t at = size_t(cp_layer_ * 4 + i);
    while (cp_events_.size() <= at) cp_events_.push_back(std::make_unique<cudart::TimingEvent>());
    DSV41RT_CU(cudaEventRecord(cp_events_[at]->get(), s));
    if (i == 3) ++cp_layer_;
  }
  // After the forward's synchronisation: sums over layers of the Q projection's and the
  // all-gather's device time and of the time both ran (microseconds).
  void read_cp_timing() {
    cp_q_us_ = cp_gather_us_ = cp_overlap_us_ = 0;
    cp_layers_ = cp_layer_;
    auto at = [&](int64_t l, int i) {
      float ms = 0.0f;
      DSV41RT_CU(cudaEventElapsedTime(&ms, st_->t0.get(), cp_events_[size_t(l * 4 + i)]->get()));
      return double(ms) * 1000.0;
    };
    for (int64_t l = 0; l < cp_layer_; ++l) {
      const double q0 = at(l, 0), q1 = at(l, 1), g0 = at(l, 2), g1 = at(l, 3);
      cp_q_us_ += int64_t(q1 - q0);
      cp_gather_us_ += int64_t(g1 - g0);
      cp_overlap_us_ += int64_t(std::max(0.0, std::min(q1, g1) - std::max(q0, g0)));
    }
  }
  bool use_tc_ = false;  // this forward's GEMM choice (see tensor_cores)
  int topk_source_ = -1;
  int candidates_ratio_ = -1;

  std::map<DecodeBucket, std::unique_ptr<Graph>> graphs_;
  int64_t captures_ = 0, replays_ = 0;
  int64_t last_forward_us_ = 0;  // device time of the last forward (CUDA events)
};

kc::PagedRows CudaExecutor::paged(int source_layer, bool key, const ForwardPlan& f) const {
  kc::PagedRows p;
  p.pool = pool_->page_data(0);
  p.page_bytes = pool_->geometry().page_bytes;
  p.page_table = meta_.page_table;
  p.max_pages = f.max_pages;
  p.per_page = layout_->entries_per_page(source_layer);
  p.offset = layout_->entry_offset(source_layer, key);
  p.row_bytes = key ? layout_->key_codec().row_bytes : layout_->kv_codec().row_bytes;
  return p;
}

// Routed + shared experts of N tokens. Tensor cores (expert-grouped rows) where the precision
// allows; otherwise the FP32 split kernels in passes over at most kMoeSplitFloats of scratch.
void CudaExecutor::moe_experts(const float* x, const int32_t* idx, const float* weight, int64_t N,
                               int64_t E, int64_t k, const CudaLayerWeights& w, float* y,
                               cudaStream_t s) {
  const ModelConfig& c = plan_.config;
  const int64_t H = c.hidden_size, I = c.moe_intermediate_size;
  const float limit = float(c.swiglu_limit);
  auto b = [](DevMatrix m) { return static_cast<const uint16_t*>(m.ptr); };
  if (tensor_cores(w.w1, N)) {
    const int64_t Is = w.shared_w1 ? I : 0;
    const kc::MoeGroupedSizes sz = kc::moe_grouped_sizes(N, H, k, E, I, Is);
    int32_t* ints = moe_ints_.ensure(sz.ints, generation_);
    float* floats = moe_work_.ensure(sz.floats, generation_);
    const kc::MoeGroupedWorkspace ws = kc::moe_grouped_carve(ints, floats, N, H, k, E, I, Is);
    DSV41RT_CU(kc::moe_grouped_bf16(x, idx, weight, N, H, k, E, I, b(w.w1), b(w.w3), b(w.w2),
                                    b(w.shared_w1), b(w.shared_w3), b(w.shared_w2), Is, limit, y,
                                    ws, s));
    return;
  }
  constexpr int64_t kMoeSplitFloats = int64_t(64) << 20;  // 256 MiB
  const int64_t per_token = kc::moe_split_workspace_floats(1, k, I, I);
  const int64_t chunk = std::clamp<int64_t>(kMoeSplitFloats / per_token, 1, N);
  float* work = moe_work_.ensure(chunk * per_token, generation_);
  DSV41RT_CU(
      moe_experts_fp32(x, idx, weight, N, H, k, E, I, w, limit, y, work, chunk * per_token, s));
}

void CudaExecutor::upload(const ForwardPlan& f, const QueryRows* q) {
  cudart::MetaUpload& u = meta_up_;
  u.clear();
  const size_t tokens = u.add(f.tokens), row_item = u.add(f.row_item),
               positions = u.add(f.positions), store = u.add(f.store_window),
               slots = u.add(f.slots), length = u.add(f.length), wfirst = u.add(f.window_first),
               old_count = u.add(f.old_count), old_offset = u.add(f.old_offset),
               row0 = u.add(f.row0), pages = u.add(f.page_table), head = u.add(f.head_rows);
  const int64_t hc = plan_.config.hc_mult;
  std::vector<float> onehot(f.rows * hc, 0.0f);
  for (int64_t t = 0; t < f.rows; ++t) onehot[t * hc] = 1.0f;
  const size_t pre0 = u.add(onehot);
  struct RatioOffsets {
    size_t count, comp_offset, n_visible, key_offset, gi, gp, gf, ge, gpos, li, ls, ld;
  };
  std::map<int, RatioOffsets> ro;
  for (const RatioPlan& r : f.ratios) {
    ro[r.ratio] = {u.add(r.count),       u.add(r.comp_offset), u.add(r.n_visible),
                   u.add(r.key_offset),  u.add(r.group_item),  u.add(r.group_pending),
                   u.add(r.group_first), u.add(r.group_entry), u.add(r.group_position),
                   u.add(r.left_item),   u.add(r.left_src),    u.add(r.left_dst)};
  }
  std::vector<size_t> engram;
  for (const auto& rows : f.engram_rows) engram.push_back(u.add(rows));
  size_t q_tokens = 0, q_item = 0, q_pos = 0, src_row = 0;
  std::vector<std::pair<size_t, size_t>> q_ratio;
  std::vector<size_t> q_engram;
  if (q) {
    q_tokens = u.add(q->tokens), q_item = u.add(q->row_item), q_pos = u.add(q->positions);
    for (size_t r = 0; r < f.ratios.size(); ++r) {
      q_ratio.emplace_back(u.add(q->n_visible[r]), u.add(q->key_offset[r]));
    }
    for (const auto& rows : q->engram_rows) q_engram.push_back(u.add(rows));
    const int64_t P = comm_->size();
    std::vector<int64_t> src(f.rows);
    for (int64_t g = 0; g < f.rows; ++g) src[g] = (g % P) * q->max_local + g / P;
    src_row = u.add(src);
  }
  u.upload(main(), generation_);
  Meta& m = meta_;
  m.tokens = u.device<int32_t>(tokens);
  m.row_item = u.device<int32_t>(row_item);
  m.positions = u.device<int64_t>(positions);
  m.store_window = u.device<uint8_t>(store);
  m.slots = u.device<uint8_t* const>(slots);
  m.length = u.device<int64_t>(length);
  m.window_first = u.device<int64_t>(wfirst);
  m.old_count = u.device<int64_t>(old_count);
  m.old_offset = u.device<int64_t>(old_offset);
  m.row0 = u.device<int64_t>(row0);
  m.page_table = u.device<int32_t>(pages);
  m.head_rows = u.device<int64_t>(head);
  m.pre0 = u.device<float>(pre0);
  m.ratio.clear();
  for (const auto& [r, o] : ro) {
    m.ratio[r] = {u.device<int64_t>(o.count),     u.device<int64_t>(o.comp_offset),
                  u.device<int64_t>(o.n_visible), u.device<int64_t>(o.key_offset),
                  u.device<int32_t>(o.gi),        u.device<int32_t>(o.li),
                  u.device<int64_t>(o.gp),        u.device<int64_t>(o.gf),
                  u.device<int64_t>(o.ge),        u.device<int64_t>(o.gpos),
                  u.device<int64_t>(o.ls),        u.device<int64_t>(o.ld)};
  }
  m.engram_rows.clear();
  for (size_t off : engram) m.engram_rows.push_back(u.device<int64_t>(off));
  m.q_ratio.clear();
  m.q_engram_rows.clear();
  if (!q) {
    m.nq = f.rows;
    m.q_tokens = m.tokens, m.q_row_item = m.row_item, m.q_positions = m.positions;
    for (const auto& [r, o] : m.ratio) m.q_ratio[r] = {o.n_visible, o.key_offset};
    m.q_engram_rows = m.engram_rows;
    m.cp_src_row = nullptr;
    return;
  }
  m.nq = q->rows;
  m.q_tokens = u.device<int32_t>(q_tokens);
  m.q_row_item = u.device<int32_t>(q_item);
  m.q_positions = u.device<int64_t>(q_pos);
  for (size_t r = 0; r < f.ratios.size(); ++r) {
    m.q_ratio[f.ratios[r].ratio] = {u.device<int64_t>(q_ratio[r].first),
                                    u.device<int64_t>(q_ratio[r].second)};
  }
  for (size_t off : q_engram) m.q_engram_rows.push_back(u.device<int64_t>(off));
  m.cp_src_row = u.device<int64_t>(src_row);
}

void CudaExecutor::gather_rows(const float* local, int64_t dim, int64_t rows, float* out,
                               cudaStream_t s) {
  const int64_t P = comm_->size(), count = qv_.max_local * dim;
  float* recv = cp_recv_.ensure(std::max<int64_t>(P * count, 1), generation_);
  if (comm_->device_buffers()) {
    comm_->all_gather(local, recv, size_t(count), DType::kF32, s);
  } else {
    // A host communicator (LocalComm virtual ranks): stage through pinned host memory.
    if (cp_host_.size() < size_t((P + 1) * count)) {
      cp_host_.resize(size_t((P + 1) * count));
    }
    float* hsend = cp_host_.data();
    float* hrecv = hsend + count;
    DSV41RT_CU(
        cudaMemcpyAsync(hsend, local, size_t(count) * sizeof(float), cudaMemcpyDeviceToHost, s));
    DSV41RT_CU(cudaStreamSynchronize(s));
    comm_->all_gather(hsend, hrecv, size_t(count), DType::kF32, nullptr);
    DSV41RT_CU(
        cudaMemcpyAsync(recv, hrecv, size_t(P * count) * sizeof(float), cudaMemcpyHostToDevice, s));
    DSV41RT_CU(cudaStreamSynchronize(s));  // the pageable staging buffer is reused next call
  }
  DSV41RT_CU(kc::gather_rows(recv, meta_.cp_src_row, rows, dim, out, s));
}

// Full layers: the new entries of every item (spec §2.4), written to the pages.
void CudaExecutor::compressor(const LayerPlan& layer, const CudaLayerWeights& w,
                              const ForwardPlan& f, const float* x, cudaStream_t s) {
  const ModelConfig& c = plan_.config;
  const int64_t H = c.hidden_size, D = c.head_dim, DI = c.index_head_dim, m = layer.ratio;
  const int64_t N = f.rows, R = c.qk_rope_head_dim;
  const float eps = float(c.rms_norm_eps);
  const RatioPlan& rp = f.ratio(m);
  const Meta::Ratio& mr = meta_.ratio.at(m);
  const int64_t G = int64_t(rp.group_item.size());
  float* cv = cv_.ensure(N * D, generation_);
  DSV41RT_CU(lin(x, w.comp_wkv, N, H, D, cv, false, s));
  float* latent = cv;  // ratio 1: every row is a group of one (softmax weight exactly 1)
  if (m > 1) {
    float* cs = cs_.ensure(N * D, generation_);
    DSV41RT_CU(lin(x, w.comp_wgate, N, H, D, cs, false, s));
    latent = ikeys_new_.ensure(std::max<int64_t>(G, 1) * std::max(D, DI) * 2, generation_);
    const int64_t pend = layout_->pending_offset(layer.index);
    DSV41RT_CU(kc::compress_pool_gather(cv, cs, meta_.slots, pend, G, m, D, mr.group_item,
                                        mr.group_pending, mr.group_first, latent, s));
    DSV41RT_CU(kc::store_pending(cv, cs, meta_.slots, pend, m, D, int64_t(rp.left_item.size()),
                                 mr.left_item, mr.left_src, mr.left_dst, s));
  }
  if (G == 0) return;
  float* keys =
      (m > 1 ? latent + G * D : ikeys_new_.ensure(std::max<int64_t>(G, 1) * DI, generation_));
  DSV41RT_CU(kc::rms_norm(latent, w.comp_norm, G, D, eps, latent, s));
  // Index keys come from the un-rotated latent; then the latent itself is rotated and stored.
  DSV41RT_CU(lin(latent, w.idx_wk, G, D, DI, keys, false, s));
  DSV41RT_CU(kc::rms_norm(keys, w.idx_k_norm, G, DI, eps, keys, s));
  DSV41RT_CU(kc::apply_rope(keys, G, 1, DI, R, mr.group_position, w.inv_freq, false, s));
  DSV41RT_CU(kc::apply_rope(latent, G, 1, D, R, mr.group_position, w.inv_freq, false, s));
  DSV41RT_CU(kc::pack_paged(key_fmt_, paged(layer.index, true, f), DI, G, keys, mr.group_item,
                            mr.group_entry, s));
  DSV41RT_CU(kc::pack_paged(kv_fmt_, paged(layer.index, false, f), D, G, latent, mr.group_item,
                            mr.group_entry, s));
}

// Full and Reindex layers: indexer scores over the source's keys, candidates, top-k.
void CudaExecutor::indexer(const LayerPlan& layer, const CudaLayerWeights& w, const ForwardPlan& f,
                           cudaStream_t s) {
  const ModelConfig& c = plan_.config;
  // Queries, weights, scores and the top-k of the query rows (N of them).
  const int64_t H = c.hidden_size, N = meta_.nq, R = c.qk_rope_head_dim;
  const int64_t HI = c.index_n_heads, DI = c.index_head_dim, KI = c.index_topk;
  const RatioPlan& rp = f.ratio(layer.ratio);
  const Meta::Ratio& mr = meta_.ratio.at(layer.ratio);
  const Meta::QRatio& qv = meta_.q_ratio.at(layer.ratio);
  const int64_t T = rp.max_count;
  float* qi = qi_.ensure(N * HI * DI, generation_);
  float* wts = wts_.ensure(N * HI, generation_);
  DSV41RT_CU(lin(qr_.get(), w.idx_wq_b, N, c.q_lora_rank, HI * DI, qi, false, s));
  DSV41RT_CU(kc::apply_rope(qi, N, HI, DI, R, meta_.q_positions, w.inv_freq, false, s));
  if (options_.cache_quant) DSV41RT_CU(kc::mxfp4_qdq(qi, N * HI, DI, qi, s));  // MXFP4 queries
  DSV41RT_CU(lin(xn_.get(), w.idx_weights_proj, N, H, HI, wts, false, s));
  const float wscale = float(std::pow(double(DI), -0.5) * std::pow(double(HI), -0.5));
  DSV41RT_CU(kc::scale_inplace(wts, N * HI, wscale, s));
  if (layer.role == LayerRole::kFull) st_->comp.link(side(1), s);  // this layer's new keys
  float* ikeys = ikeys_.ensure(std::max<int64_t>(rp.comp_rows, 1) * DI, generation_);
  float* scores = scores_.ensure(std::max<int64_t>(N * T, 1), generation_);
  int32_t* topk = topk_.ensure(N * KI, generation_);
  DSV41RT_CU(kc::unpack_paged(key_fmt_, paged(layer.kv_source, true, f), DI, f.items, T, mr.count,
                              mr.comp_offset, ikeys, s));
  DSV41RT_CU(kc::indexer_scores_offset(qi, ikeys, qv.key_offset, wts, qv.n_visible, N, HI, DI, T,
                                       scores, s));
  if (layer.candidates == CandidateRole::kSource) {
    uint8_t* mask = mask_.ensure(std::max<int64_t>(N * T, 1), generation_);
    if (T > 0) {
      DSV41RT_CU(kc::candidate_blocks(scores, qv.n_visible, N, T, c.candidate_topk_blocks,
                                      c.candidate_block_size, mask, s));
    }
    candidates_ratio_ = layer.ratio;
  } else if (layer.candidates == CandidateRole::kUses) {
    DSV41RT_CHECK(candidates_ratio_ == layer.ratio, "layer ", layer.index,
                  " uses candidates of ratio ", layer.ratio, " but the candidate source has ratio ",
                  candidates_ratio_);
    DSV41RT_CU(kc::apply_candidate_mask(scores, mask_.get(), N * T, s));
  }
  if (T > 0) {
    DSV41RT_CU(kc::topk_select(scores, N, T, KI, topk, s));
  } else {
    DSV41RT_CU(cudaMemsetAsync(topk, 0xFF, size_t(N * KI) * sizeof(int32_t), s));  // all -1
  }
  topk_source_ = layer.index;
}

void CudaExecutor::attention(const LayerPlan& layer, const CudaLayerWeights& w,
                             const ForwardPlan& f) {
  const ModelConfig& c = plan_.config;
  const int64_t H = c.hidden_size, D = c.head_dim, nh = c.num_attention_heads;
  const int64_t R = c.qk_rope_head_dim, W = c.sliding_window, N = f.rows, NQ = meta_.nq;
  const float eps = float(c.rms_norm_eps);
  const cudaStream_t s = main();
  const bool full = layer.role == LayerRole::kFull;
  const bool selects = full || layer.role == LayerRole::kReindex;
  float* qr = qr_.ensure(NQ * c.q_lora_rank, generation_);
  float* q = q_.ensure(NQ * nh * D, generation_);
  auto q_projection = [&](cudaStream_t qs) {
    DSV41RT_CU(lin(xn_.get(), w.wq_a, NQ, H, c.q_lora_rank, qr, false, qs));
    DSV41RT_CU(kc::rms_norm(qr, w.q_norm, NQ, c.q_lora_rank, eps, qr, qs));
    DSV41RT_CU(lin(qr, w.wq_b, NQ, c.q_lora_rank, nh * D, q, false, qs));
    DSV41RT_CU(kc::apply_rope(q, NQ, nh, D, R, meta_.q_positions, w.inv_freq, false, qs));
  };

  const float* xs = xn_.get();  // the state rows' hidden states (all rows)
  if (comm_) {
    // Context parallelism: the Q projection of this rank's rows runs on a side stream while
    // the main stream all-gathers every row's hidden state, BEFORE the other side streams fork
    // (collectives in a fixed order on one stream; docs/design/context-parallel.md). The
    // indexer follows the Q projection on the same side stream, after the compressor.
    st_->fork.link(s, side(2));
    cp_mark(0, side(2));
    if (NQ > 0) q_projection(side(2));
    cp_mark(1, side(2));
    float* xg = xg_.ensure(N * H, generation_);
    cp_mark(2, s);
    gather_rows(xn_.get(), H, N, xg, s);
    cp_mark(3, s);
    xs = xg;
    if (full) {
      st_->fork.link(s, side(1));
      compressor(layer, w, f, xs, side(1));
      if (side(1) != s) DSV41RT_CU(cudaEventRecord(st_->comp.get(), side(1)));
    }
    if (selects && NQ > 0) indexer(layer, w, f, side(2));
    if (selects) topk_source_ = layer.index;  // (no query rows: nothing selected, nothing read)
    if (side(2) != s) DSV41RT_CU(cudaEventRecord(st_->idx.get(), side(2)));
  } else {
    // Fork: the layer input xn is ready; the compressor needs nothing else.
    if (full) {
      st_->fork.link(s, side(1));
      compressor(layer, w, f, xs, side(1));
      if (side(1) != s) DSV41RT_CU(cudaEventRecord(st_->comp.get(), side(1)));
    }
    DSV41RT_CU(lin(xn_.get(), w.wq_a, NQ, H, c.q_lora_rank, qr, false, s));
    DSV41RT_CU(kc::rms_norm(qr, w.q_norm, NQ, c.q_lora_rank, eps, qr, s));
    if (selects) {
      st_->qr.link(s, side(2));
      indexer(layer, w, f, side(2));
      if (side(2) != s) DSV41RT_CU(cudaEventRecord(st_->idx.get(), side(2)));
    }
    // Q projection on the main stream, overlapping the side streams.
    DSV41RT_CU(lin(qr, w.wq_b, NQ, c.q_lora_rank, nh * D, q, false, s));
    DSV41RT_CU(kc::apply_rope(q, NQ, nh, D, R, meta_.q_positions, w.inv_freq, false, s));
  }
  // The window KV of every row on the main stream.
  float* kv_a = kv_a_.ensure((f.old_rows + N) * D, generation_);
  float* kv = kv_a + f.old_rows * D;  // this forward's rows follow the ring rows
  DSV41RT_CU(lin(xs, w.wkv, N, H, D, kv, false, s));
  DSV41RT_CU(kc::rms_norm(kv, w.kv_norm, N, D, eps, kv, s));
  DSV41RT_CU(kc::apply_rope(kv, N, 1, D, R, meta_.positions, w.inv_freq, false, s));
  if (options_.cache_quant) DSV41RT_CU(kc::fp8_window_qdq(kv, N, D, kv, s));
  kc::RingRows ring{meta_.slots, layout_->window_offset(layer.index), W,
                    layout_->window_codec().row_bytes};
  // Read first, write last: the older rows leave the ring before this forward's rows enter it.
  DSV41RT_CU(kc::unpack_ring(window_fmt_, ring, D, f.items, f.max_old, meta_.window_first,
                             meta_.old_count, meta_.old_offset, kv_a, s));
  st_->kv.link(s, side(0));
  DSV41RT_CU(kc::pack_ring(window_fmt_, ring, D, N, kv, meta_.row_item, meta_.positions,
                           meta_.store_window, side(0)));

  // Join the compressor, then the ratio's workspace (first consumer dequantises, the rest reuse).
  const float* comp = nullptr;
  int64_t comp_rows = 0;
  const Meta::Ratio* mr = nullptr;
  if (layer.ratio > 0) {
    const RatioPlan& rp = f.ratio(layer.ratio);
    mr = &meta_.ratio.at(layer.ratio);
    if (full) {
      if (side(1) != s) DSV41RT_CU(cudaStreamWaitEvent(s, st_->comp.get(), 0));
      workspaces_.note_source_write(layer.index);
    }
    comp_rows = rp.comp_rows;
    const kc::PagedRows src = paged(layer.kv_source, false, f);
    comp = static_cast<const float*>(workspaces_.acquire(
        layer.ratio, layer.kv_source, comp_rows, D * int64_t(sizeof(float)),
        [&](void* dst, int64_t) {
          DSV41RT_CU(kc::unpack_paged(kv_fmt_, src, D, f.items, rp.max_count, mr->count,
                                      mr->comp_offset, static_cast<float*>(dst), s));
        }));
  }
  if ((selects || comm_) && side(2) != s) DSV41RT_CU(cudaStreamWaitEvent(s, st_->idx.get(), 0));
  st_->store.link(side(0), s);
  const int64_t KI = layer.ratio > 0 ? c.index_topk : 0;
  if (NQ == 0) return;  // a CP rank without query rows: the state writes above were its part
  if (KI > 0) {
    DSV41RT_CHECK(topk_source_ == layer.topk_source, "layer ", layer.index,
                  " expects the top-k of layer ", layer.topk_source, ", found ", topk_source_);
  }
  // Attention of the query rows over the keys of every row.
  int32_t* idx = idx_.ensure(NQ * (W + KI), generation_);
  DSV41RT_CU(kc::attention_indices(NQ, W, KI, meta_.q_row_item, meta_.q_positions,
                                   meta_.window_first, meta_.length, meta_.old_offset, meta_.row0,
                                   f.old_rows, KI ? topk_.get() : nullptr,
                                   mr ? mr->comp_offset : nullptr, f.old_rows + N, idx, s));
  float* o = o_.ensure(NQ * nh * D, generation_);
  DSV41RT_CU(kc::sparse_attention_split(q, kv_a, f.old_rows + N, comp, comp_rows, idx, w.attn_sink,
                                        NQ, nh, D, W + KI, float(1.0 / std::sqrt(double(D))), o,
                                        s));
  DSV41RT_CU(kc::apply_rope(o, NQ, nh, D, R, meta_.q_positions, w.inv_freq, true, s));
  const int64_t g = c.o_groups, kg = nh * D / g, ro = c.o_lora_rank;
  float* z = z_.ensure(NQ * g * ro, generation_);
  DSV41RT_CU(grouped_lin(o, w.wo_a, NQ, g, kg, ro, z, s));
  DSV41RT_CU(lin(z, w.wo_b, NQ, g * ro, H, yv_.get(), false, s));
  if (options_.record_decisions && selects) {
    std::vector<int32_t> host(NQ * KI);
    DSV41RT_CU(cudaMemcpyAsync(host.data(), topk_.get(), host.size() * sizeof(int32_t),
                               cudaMemcpyDeviceToHost, s));
    DSV41RT_CU(cudaStreamSynchronize(s));
    sorted_rows(host, NQ, KI, decisions_["topk_L" + std::to_string(layer.index)]);
  }
}

void CudaExecutor::run(const ForwardPlan& f) {
  const ModelConfig& c = plan_.config;
  // The streams carry the query rows (this rank's under context parallelism, else all rows);
  // xn and u are sized for the all-gather's per-rank count.
  const int64_t H = c.hidden_size, hc = c.hc_mult, N = meta_.nq, V = c.vocab_size;
  const int64_t NA = comm_ ? qv_.max_local : N;
  const float eps = float(c.rms_norm_eps), hc_eps = float(c.hc_eps);
  const cudaStream_t s = main();
  float* X = X_.ensure(N * hc * H, generation_);
  float* X1 = X1_.ensure(N * hc * H, generation_);
  float* u = u_.ensure(NA * H, generation_);
  float* xn = xn_.ensure(NA * H, generation_);
  float* yv = yv_.ensure(N * H, generation_);
  float* pre = pre_.ensure(N * hc, generation_);
  float* a_pre = a_pre_.ensure(N * hc, generation_);
  float* a_post = a_post_.ensure(N * hc, generation_);
  float* a_comb = a_comb_.ensure(N * hc * hc, generation_);
  float* f_pre = f_pre_.ensure(N * hc, generation_);
  float* f_post = f_post_.ensure(N * hc, generation_);
  float* f_comb = f_comb_.ensure(N * hc * hc, generation_);

  // A CP rank may own no rows of a short batch: it still takes part in the all-gathers and
  // writes every row's state (attention), and skips the row-wise ops.
  const bool rows_here = N > 0;
  if (rows_here) {
    DSV41RT_CU(kc::embed_rows(weights_.embed, weights_.embed_bf16, meta_.q_tokens, N, H, hc, X, s));
    DSV41RT_CU(cudaMemcpyAsync(pre, meta_.pre0, size_t(N * hc) * sizeof(float),
                               cudaMemcpyDeviceToDevice, s));
  }

  int engram_pos = 0;
  for (size_t li = 0; li < plan_.layers.size(); ++li) {
    const LayerPlan& layer = plan_.layers[li];
    const CudaLayerWeights& w = weights_.layers[li];
    if (layer.engram && rows_here) {
      const EngramSpec& e = *c.engram;
      const int64_t cols = int64_t(e.max_ngram_size - 1) * e.n_heads, hd = e.head_dim;
      float* emb = emb_.ensure(N * cols * hd, generation_);
      float* ws = engram_ws_.ensure(kc::engram_forward_workspace(N, hc, H), generation_);
      DSV41RT_CU(kc::engram_gather(w.engram_table, w.engram_scale, meta_.q_engram_rows[engram_pos],
                                   N * cols, hd, emb, s));
      DSV41RT_CU(kc::engram_forward(X, emb, w.engram_wkv, w.engram_q, w.engram_k, nullptr, N, hc, H,
                                    cols * hd, eps, ws, s));
    }
    if (layer.engram) ++engram_pos;
    if (rows_here) {
      DSV41RT_CU(kc::hc_mix(X, w.hc_attn_fn, w.hc_attn_base, w.hc_attn_scale, N, hc, H, eps, hc_eps,
                            c.hc_sinkhorn_iters, a_pre, a_post, a_comb, s));
      DSV41RT_CU(kc::hc_collapse(X, pre, N, hc, H, u, s));
      DSV41RT_CU(kc::rms_norm(u, w.attn_norm, N, H, eps, xn, s));
    }
    attention(layer, w, f);
    if (!rows_here) {
      std::swap(pre, f_pre);
      continue;
    }
    DSV41RT_CU(kc::hc_expand(X, yv, a_post, a_comb, N, hc, H, X1, s));
    DSV41RT_CU(kc::hc_mix(X1, w.hc_ffn_fn, w.hc_ffn_base, w.hc_ffn_scale, N, hc, H, eps, hc_eps,
                          c.hc_sinkhorn_iters, f_pre, f_post, f_comb, s));
    DSV41RT_CU(kc::hc_collapse(X1, a_pre, N, hc, H, u, s));
    DSV41RT_CU(kc::rms_norm(u, w.ffn_norm, N, H, eps, xn, s));
    // MoE (spec §5): route, then routed + shared experts.
    const int64_t E = layer.n_experts, k = layer.experts_per_tok;
    int32_t* midx = moe_idx_.ensure(N * k, generation_);
    float* mw = moe_w_.ensure(N * k, generation_);
    DSV41RT_CU(kc::moe_route(xn, w.gate, w.bias, N, H, E, k, float(c.routed_scaling_factor),
                             c.norm_topk_prob, midx, mw, s));
    moe_experts(xn, midx, mw, N, E, k, w, yv, s);
    if (options_.record_decisions) {
      std::vector<int32_t> host(N * k);
      DSV41RT_CU(cudaMemcpyAsync(host.data(), midx, host.size() * sizeof(int32_t),
                                 cudaMemcpyDeviceToHost, s));
      DSV41RT_CU(cudaStreamSynchronize(s));
      sorted_rows(host, N, k, decisions_["experts_L" + std::to_string(layer.index)]);
    }
    DSV41RT_CU(kc::hc_expand(X1, yv, f_post, f_comb, N, hc, H, X, s));
    std::swap(pre, f_pre);
  }
  if (rows_here) DSV41RT_CU(kc::hc_collapse(X, pre, N, hc, H, u, s));
  const float* u_all = u;
  if (comm_) {  // every rank gathers the final hidden states and computes every wanted logit
    float* ug = ug_.ensure(f.rows * H, generation_);
    gather_rows(u, H, f.rows, ug, s);
    u_all = ug;
  }
  const int64_t rows = int64_t(f.head_rows.size());
  float* hsel = hsel_.ensure(rows * H, generation_);
  float* logits = logits_.ensure(rows * V, generation_);
  DSV41RT_CU(kc::gather_rows(u_all, meta_.head_rows, rows, H, hsel, s));
  DSV41RT_CU(kc::rms_norm(hsel, weights_.norm, rows, H, eps, hsel, s));
  DSV41RT_CU(lin(hsel, weights_.head, rows, H, V, logits, false, s));
}

// Host bookkeeping of a forward and the metadata upload (outside any capture).
void CudaExecutor::begin(const ForwardPlan& f, const QueryRows* q) {
  workspaces_.begin_forward();
  decisions_.clear();
  topk_source_ = -1;
  candidates_ratio_ = -1;
  upload(f, q);
}

// Records run(f) as a graph. Nothing executes during capture, so the workspace counters the
// acquires moved are taken back and kept as the per-replay delta.
std::unique_ptr<CudaExecutor::Graph> CudaExecutor::capture(const ForwardPlan& f) {
  auto g = std::make_unique<Graph>();
  g->generation = generation_;
  g->ws_generation = workspaces_.storage_generation();
  g->meta_base = meta_up_.base();
  const DequantCounters before = workspaces_.counters();
  workspaces_.begin_forward();
  topk_source_ = -1;
  candidates_ratio_ = -1;
  cudaGraph_t graph = nullptr;
  DSV41RT_CU(cudaStreamBeginCapture(main(), cudaStreamCaptureModeThreadLocal));
  try {
    run(f);
  } catch (...) {
    cudaStreamEndCapture(main(), &graph);
    if (graph) cudaGraphDestroy(graph);
    workspaces_.set_counters(before);
    throw;
  }
  DSV41RT_CU(cudaStreamEndCapture(main(), &graph));
  const DequantCounters after = workspaces_.counters();
  workspaces_.set_counters(before);
  g->delta = {after.dequant_calls - before.dequant_calls, after.reuse_hits - before.reuse_hits,
              after.rows_dequantised - before.rows_dequantised, 0};
  const cudaError_t e = cudaGraphInstantiate(&g->exec, graph, 0);
  cudaGraphDestroy(graph);
  DSV41RT_CU(e);
  // A buffer that moved during capture (it cannot: the eager run before sized them) would leave
  // the graph pointing at freed memory; keep it only when nothing moved.
  if (!graph_valid(g.get())) return nullptr;
  ++captures_;
  return g;
}

void CudaExecutor::forward_impl(std::vector<BatchItem>& batch, comm::Communicator* comm) {
  DSV41RT_CU(cudaSetDevice(device_));
  const ModelConfig& c = plan_.config;
  std::vector<const int32_t*> histories;
  for (const BatchItem& b : batch) {
    histories.push_back(b.request.slot ? history(b) : nullptr);
  }
  const ForwardPlan f = plan_forward(plan_, *layout_, batch, engram_, histories);
  for (size_t l = 0; l < f.engram_rows.size(); ++l) {
    const int64_t limit = weights_.layers[c.engram->layer_ids[l]].engram_rows;
    for (int64_t r : f.engram_rows[l]) {
      DSV41RT_CHECK(r >= 0 && r < limit, "Engram row ", r, " outside the table (", limit, " rows)");
    }
  }
  // Decode batches run as a graph of their bucket (captured on first use after an eager run of
  // the same padded plan, replayed after); everything else, and recording runs, eagerly.
  const DecodeBucket bucket = options_.cuda_graphs && !options_.record_decisions && !comm
                                  ? decode_bucket(c, batch)
                                  : DecodeBucket{};
  use_tc_ = bf16_gemm_ && f.rows > kFp32MaxRows;
  DSV41RT_CU(cudaEventRecord(st_->t0.get(), main()));
  if (comm) {
    // Context parallelism (eager): this rank's query rows, every row's state.
    comm_ = comm;
    cp_layer_ = 0;
    qv_ = query_rows(f, comm->rank(), comm->size());
    try {
      begin(f, &qv_);
      run(f);
    } catch (...) {
      comm_ = nullptr;
      throw;
    }
    comm_ = nullptr;
    ++eager_forwards_;
  } else if (bucket.items > 0) {
    const ForwardPlan padded = pad_decode_plan(f, c, *layout_, bucket);
    begin(padded);
    std::unique_ptr<Graph>& g = graphs_[bucket];
    if (graph_valid(g.get())) {
      DSV41RT_CU(cudaGraphLaunch(g->exec, main()));
      DequantCounters n = workspaces_.counters();
      n.dequant_calls += g->delta.dequant_calls;
      n.reuse_hits += g->delta.reuse_hits;
      n.rows_dequantised += g->delta.rows_dequantised;
      workspaces_.set_counters(n);
      ++replays_;
    } else {
      run(padded);
      ++eager_forwards_;
      g = capture(padded);
    }
  } else {
    begin(f);
    run(f);
    ++eager_forwards_;
  }
  const int64_t V = c.vocab_size;
  std::vector<float> logits(f.head_rows.size() * V);  // real rows come first in a padded plan
  DSV41RT_CU(cudaMemcpyAsync(logits.data(), logits_.get(), logits.size() * sizeof(float),
                             cudaMemcpyDeviceToHost, main()));
  DSV41RT_CU(cudaEventRecord(st_->t1.get(), main()));
  DSV41RT_CU(cudaStreamSynchronize(main()));
  float ms = 0.0f;
  DSV41RT_CU(cudaEventElapsedTime(&ms, st_->t0.get(), st_->t1.get()));
  if (comm && cp_timing_) read_cp_timing();
  last_forward_us_ = int64_t(double(ms) * 1000.0);
  size_t r = 0;
  for (BatchItem& b : batch) {
    const int64_t count = b.all_logits ? b.n : 1;
    std::copy(logits.begin() + r * V, logits.begin() + (r + count) * V, b.logits);
    r += count;
  }
  // Engram history mirror: the last `hist` ids of (old history, chunk).
  const int64_t hist = layout_->history_len();
  if (hist > 0) {
    for (BatchItem& b : batch) {
      int32_t* h = history(b);
      std::vector<int32_t> all(h, h + hist);
      all.insert(all.end(), b.tokens, b.tokens + b.n);
      std::copy(all.end() - hist, all.end(), h);
    }
  }
}

}  // namespace

std::shared_ptr<Executor> make_cuda_executor(ModelPlan plan, ModelWeights weights,
                                             EngramTables engram, ExecutorOptions options) {
  return std::make_shared<CudaExecutor>(std::move(plan), std::move(weights), std::move(engram),
                                        std::move(options));
}

}  // namespace dsv41rt::model
