// The GPU executor's class (internal to cuda_executor*.cc; the public entry point is
// cuda_executor.h). Split over cuda_executor.cc (planning upload, the layer loop, graphs,
// forward) and cuda_executor_attention.cc (attention, compressor, indexer).
#pragma once

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
#include "runtime/model/cuda_executor.h"
#include "runtime/model/cuda_resources.h"
#include "runtime/model/cuda_weights.h"
#include "runtime/model/forward_plan.h"

namespace dsv41rt::model {

namespace kc = kernels::cuda;
using cudart::DeviceArray;
using kc::RowFormat;

namespace cuda_detail {

inline int parse_device(const std::string& d) {
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
inline cudaError_t lin_fp32(const float* x, DevMatrix w, int64_t m, int64_t k, int64_t n, float* y,
                            bool accumulate, cudaStream_t s) {
  return w.bf16
             ? kc::linear_bf16w(x, static_cast<const uint16_t*>(w.ptr), m, k, n, y, accumulate, s)
             : kc::linear(x, static_cast<const float*>(w.ptr), m, k, n, y, accumulate, s);
}

inline cudaError_t grouped_lin_fp32(const float* x, DevMatrix w, int64_t m, int64_t g, int64_t k,
                                    int64_t n, float* y, cudaStream_t s) {
  return w.bf16 ? kc::grouped_linear_bf16w(x, static_cast<const uint16_t*>(w.ptr), m, g, k, n, y, s)
                : kc::grouped_linear(x, static_cast<const float*>(w.ptr), m, g, k, n, y, s);
}

// The FP32 MoE: split kernels (every SM busy at decode sizes) when weights are BF16 and a
// workspace is given, else the per-token kernel. Both compute bitwise the same values.
inline cudaError_t moe_experts_fp32(const float* x, const int32_t* idx, const float* weight,
                                    int64_t S, int64_t H, int64_t k, int64_t E, int64_t I,
                                    const CudaLayerWeights& w, float limit, float* y, float* work,
                                    int64_t work_floats, cudaStream_t s) {
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

class CudaExecutor final : public Executor {
 public:
  CudaExecutor(ModelPlan plan, ModelWeights weights, EngramTables engram, ExecutorOptions options)
      : plan_(std::move(plan)), engram_(std::move(engram)), options_(std::move(options)) {
    device_ = parse_device(options_.device);
    bf16_gemm_ = options_.precision == "bf16";
    DSV41RT_CU(cudaSetDevice(device_));
    const ModelConfig& c = plan_.config;
    check_engram_tables(c, engram_);
    const std::vector<std::vector<float>> inv_freq = rope_inv_freqs(plan_);
    weights_ = upload_weights(plan_, weights, inv_freq);
    layout_ = make_state_layout(plan_, options_);
    memory_ = plan_memory(plan_, *layout_, options_);
    const model::PoolGeometry g = layout_->geometry();
    auto device_bytes = [](int64_t bytes) {
      return std::static_pointer_cast<uint8_t>(cudart::device_alloc(bytes));
    };
    pool_ = std::make_unique<model::KvPool>(model::KvPool::from_budget(
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
    const model::PoolGeometry& g = pool_->geometry();
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
  model::KvPool& pool() override { return *pool_; }
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
  std::unique_ptr<model::KvPool> pool_;
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

}  // namespace cuda_detail
}  // namespace dsv41rt::model
