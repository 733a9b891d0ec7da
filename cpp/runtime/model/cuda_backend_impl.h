// The CUDA backend's class (cuda_backend.cc has its factory and the out-of-line members): the
// kernels of kernels/cuda on a main stream and three side streams, device memory from cudaMalloc,
// decode graphs through stream capture (updated in place with cudaGraphExecUpdate when only
// addresses changed). Internal to the library: included by cuda_backend*.cc only. Built with
// DSV41RT_WITH_CUDA.
#pragma once

#include <algorithm>
#include <array>
#include <map>
#include <vector>

#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/decode_gemv.cuh"
#include "kernels/cuda/decode_gemv_a8.cuh"
#include "kernels/cuda/engram.cuh"
#include "kernels/cuda/gemm_tc.cuh"
#include "kernels/cuda/gemm_wgmma.cuh"
#include "kernels/cuda/hadamard.cuh"
#include "kernels/cuda/indexer.cuh"
#include "kernels/cuda/linear.cuh"
#include "kernels/cuda/mhc.cuh"
#include "kernels/cuda/moe.cuh"
#include "kernels/cuda/moe_decode.cuh"
#include "kernels/cuda/moe_grouped.cuh"
#include "kernels/cuda/paged.cuh"
#include "kernels/cuda/quant.cuh"
#include "kernels/cuda/rms_norm.cuh"
#include "kernels/cuda/rope.cuh"
#include "kernels/cuda/sampling.cuh"
#include "kernels/cuda/v4_compressor.cuh"
#include "kernels/cuda/v4_hash_route.cuh"
#include "kernels/cuda/v4_hyper_head.cuh"
#include "kernels/cuda/v4_visible_entries.cuh"
#include "runtime/model/backend.h"
#include "runtime/model/cuda_graph_edges.h"
#include "runtime/model/cuda_resources.h"
#include "runtime/model/cuda_weights.h"

namespace dsv41rt::model::cuda_backend_detail {

namespace kc = kernels::cuda;

using kernels::RowFormat;

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

inline cudaStream_t cs(Stream s) { return static_cast<cudaStream_t>(s.handle); }

// Shapes the CUDA kernels do not take (kernels/cuda/attention.cuh, moe.cuh), refused at load
// rather than at the first forward.
inline void check_kernel_shapes(const ModelConfig& c) {
  DSV41RT_CHECK_CODE(kUnsupported, c.head_dim <= 512 && c.head_dim % 4 == 0, c.source,
                     ": head_dim ", c.head_dim,
                     " is not supported on CUDA (sparse attention needs <= 512, a multiple of 4)");
  int experts = c.n_routed_experts;
  if (c.dspark) experts = std::max(experts, c.dspark->n_routed_experts);
  DSV41RT_CHECK_CODE(kUnsupported, experts <= 1024, c.source, ": ", experts,
                     " routed experts are not supported on CUDA (the router takes <= 1024)");
}
inline const float* f32(const Matrix& m) { return static_cast<const float*>(m.data); }

class CudaGraph final : public BackendGraph {
 public:
  explicit CudaGraph(cudaGraphExec_t exec) : exec_(exec) {}
  ~CudaGraph() override {
    if (exec_) cudaGraphExecDestroy(exec_);
  }
  cudaGraphExec_t exec() const { return exec_; }

 private:
  cudaGraphExec_t exec_ = nullptr;
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const std::string& device) : device_(parse_device(device)) {
    activate();
    for (auto& s : streams_) s = std::make_unique<cudart::Stream>();
  }
  ~CudaBackend() override { cudaDeviceSynchronize(); }

  std::string device() const override { return "cuda:" + std::to_string(device_); }
  void activate() override { DSV41RT_CU(cudaSetDevice(device_)); }

  BackendWeights load_weights(const ModelPlan& plan, ModelWeights& weights,
                              const std::vector<std::vector<float>>& inv_freq) override {
    check_kernel_shapes(plan.config);
    BackendWeights w = upload_weights(plan, weights, inv_freq, engram_host_);
    size_gemv_workspaces(w, plan.config);
    return w;
  }
  void keep_engram_in_host_memory(bool on) override { engram_host_ = on; }
  std::shared_ptr<void> alloc(int64_t bytes) override { return cudart::device_alloc(bytes); }
  std::shared_ptr<void> alloc_host(int64_t bytes) override {
    void* p = nullptr;
    const cudaError_t e = cudaMallocHost(&p, size_t(std::max<int64_t>(bytes, 1)));
    DSV41RT_CHECK_CODE(kOutOfRange, e == cudaSuccess, "cudaMallocHost of ", bytes,
                       " bytes failed: ", cudaGetErrorString(e));
    return std::shared_ptr<void>(p, [](void* q) { cudaFreeHost(q); });
  }
  void to_device(void* dst, const void* src, int64_t bytes, Stream s) override {
    if (bytes > 0)
      DSV41RT_CU(cudaMemcpyAsync(dst, src, size_t(bytes), cudaMemcpyHostToDevice, cs(s)));
  }
  void to_host(void* dst, const void* src, int64_t bytes, Stream s) override {
    if (bytes > 0)
      DSV41RT_CU(cudaMemcpyAsync(dst, src, size_t(bytes), cudaMemcpyDeviceToHost, cs(s)));
    d2h_bytes_ += std::max<int64_t>(bytes, 0);
  }
  void copy(void* dst, const void* src, int64_t bytes, Stream s) override {
    if (bytes > 0) {
      DSV41RT_CU(cudaMemcpyAsync(dst, src, size_t(bytes), cudaMemcpyDeviceToDevice, cs(s)));
    }
  }
  void copy_2d(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch, int64_t row_bytes,
               int64_t rows, Stream s) override {
    DSV41RT_CHECK(row_bytes >= 0 && rows >= 0 && dst_pitch >= row_bytes && src_pitch >= row_bytes,
                  "copy_2d: ", rows, " rows of ", row_bytes, " bytes with pitches ", dst_pitch,
                  " / ", src_pitch);
    if (row_bytes > 0 && rows > 0) {
      DSV41RT_CU(cudaMemcpy2DAsync(dst, size_t(dst_pitch), src, size_t(src_pitch),
                                   size_t(row_bytes), size_t(rows), cudaMemcpyDeviceToDevice,
                                   cs(s)));
    }
  }
  void fill(void* dst, uint8_t byte, int64_t bytes, Stream s) override {
    if (bytes > 0) DSV41RT_CU(cudaMemsetAsync(dst, byte, size_t(bytes), cs(s)));
  }
  void synchronize(Stream s) override { DSV41RT_CU(cudaStreamSynchronize(cs(s))); }

  Stream stream(int i) override { return {streams_.at(size_t(i))->get()}; }
  void record(int id, Stream s) override { DSV41RT_CU(cudaEventRecord(event(id), cs(s))); }
  void wait(Stream s, int id) override { DSV41RT_CU(cudaStreamWaitEvent(cs(s), event(id), 0)); }
  void record_time(int id, Stream s) override {
    auto& e = timing_[id];
    if (!e) e = std::make_unique<cudart::TimingEvent>();
    DSV41RT_CU(cudaEventRecord(e->get(), cs(s)));
  }
  double elapsed_ms(int from_id, int to_id) override {
    float ms = 0.0f;
    DSV41RT_CU(cudaEventElapsedTime(&ms, timing_.at(from_id)->get(), timing_.at(to_id)->get()));
    return double(ms);
  }
  bool supports_graphs() const override { return true; }
  std::unique_ptr<BackendGraph> capture(Stream s, const std::function<void()>& body,
                                        std::unique_ptr<BackendGraph> reuse) override {
    cudaGraph_t graph = nullptr;
    DSV41RT_CU(cudaStreamBeginCapture(cs(s), cudaStreamCaptureModeThreadLocal));
    try {
      body();
    } catch (...) {
      cudaStreamEndCapture(cs(s), &graph);
      if (graph) cudaGraphDestroy(graph);
      throw;
    }
    DSV41RT_CU(cudaStreamEndCapture(cs(s), &graph));
    if (programmatic_launch_) {
      try {
        programmatic_edges_ += make_kernel_edges_programmatic(graph);
      } catch (...) {
        cudaGraphDestroy(graph);
        throw;
      }
    }
    if (auto* old = dynamic_cast<CudaGraph*>(reuse.get())) {
      cudaGraphExecUpdateResultInfo info{};
      if (cudaGraphExecUpdate(old->exec(), graph, &info) == cudaSuccess) {
        cudaGraphDestroy(graph);
        ++graph_updates_;
        return reuse;
      }
      cudaGetLastError();  // an update that does not fit is not an error: instantiate anew
    }
    cudaGraphExec_t exec = nullptr;
    const cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    DSV41RT_CU(e);
    return std::make_unique<CudaGraph>(exec);
  }
  void replay(BackendGraph& graph, Stream s) override {
    DSV41RT_CU(cudaGraphLaunch(static_cast<CudaGraph&>(graph).exec(), cs(s)));
  }
  std::map<std::string, int64_t> stats() const override {
    return {{"d2h_bytes", d2h_bytes_},
            {"graph_updates", graph_updates_},
            {"programmatic_edges", programmatic_edges_}};
  }

  void set_tensor_cores(bool on) override { tc_ = on; }
  void set_fp8_activations(bool on) override { fp8_ = on; }
  void set_programmatic_launch(bool on) override { programmatic_launch_ = on; }
  // The wgmma workspaces are never used under capture (eager_workspace refuses), so they are not
  // part of what a graph depends on.
  uint64_t workspace_generation() const override { return gemv_generation_; }
  void set_forward_rows(int64_t rows, bool decode_batch) override {
    decode_forward_ = rows <= kDecodeMaxRows;
    staged_gemm_ = !decode_forward_ && !decode_batch;
  }

  // Tensor cores take BF16-exact weights only (precision "bf16"): the skinny decode kernel in
  // decode-sized forwards, the tiled tensor-core GEMM otherwise. Everything else, and every matrix
  // under "fp32", runs the FP32 kernel, which decodes any stored format exactly. Precision "fp8"
  // quantises the input of an FP8 / FP4 matrix first: FP8 blocks in decode-sized forwards go
  // through the FP8 tensor-core GEMV, the rest take the dequantised activations (BF16-exact).
  void linear(const float* x, const Matrix& w, int64_t m, int64_t k, int64_t n, float* y,
              bool accumulate, Stream s) override {
    const kernels::WeightView v = w.view(n, k);
    if (!tc_ || !w.bf16_exact || v.format == WeightFormat::kF32) {
      DSV41RT_CU(kc::linear(x, v, m, k, n, y, accumulate, cs(s)));
      return;
    }
    if (fp8_ && w.fp8_input) {
      if (decode_gemv_a8(x, v, m, k, n, y, accumulate, s, w.whole_rows)) return;
      if (wgmma_linear(x, k, v, 0, m, k, n, y, n, accumulate, s, /*fp8_qdq=*/true)) return;
      x = fp8_act_qdq(x, m, k, s);
    }
    kc::DecodeGemv d;
    d.x = x, d.ldx = k, d.w = v, d.y = y, d.ldy = n, d.n = n, d.k = k, d.accumulate = accumulate;
    d.split_n = w.whole_rows;
    if (decode_gemv(d, m, s)) return;
    if (wgmma_linear(x, k, v, 0, m, k, n, y, n, accumulate, s)) return;
    kc::TcGemm g;
    g.a = x, g.lda = k, g.b = v, g.c = y, g.ldc = n;
    g.m = m, g.n = n, g.k = k, g.accumulate = accumulate;
    DSV41RT_CU(kc::gemm_bf16_tc(g, cs(s)));
  }
  void grouped_linear(const float* x, const Matrix& w, int64_t m, int64_t groups, int64_t k,
                      int64_t n, float* y, Stream s) override {
    const kernels::WeightView v = w.view(groups * n, k);
    if (!tc_ || !w.bf16_exact || v.format == WeightFormat::kF32) {
      DSV41RT_CU(kc::grouped_linear(x, v, m, groups, k, n, y, cs(s)));
      return;
    }
    if (fp8_ && w.fp8_input && wgmma_linear_applies(m, k) && v.format != WeightFormat::kF32 &&
        fp8_staging_fused(x, groups * k, k)) {
      for (int64_t gi = 0; gi < groups; ++gi) {
        const bool ran = wgmma_linear(x + gi * k, groups * k, v, gi * n, m, k, n, y + gi * n,
                                      groups * n, false, s, /*fp8_qdq=*/true);
        DSV41RT_CHECK_CODE(kInternal, ran, "grouped_linear: fused fp8 staging refused group ", gi);
      }
      return;
    }
    if (fp8_ && w.fp8_input) x = fp8_act_qdq(x, m * groups, k, s);
    kc::DecodeGemv d;
    d.x = x, d.ldx = groups * k, d.w = v, d.y = y, d.ldy = groups * n, d.n = n, d.k = k;
    d.batch = groups, d.stride_x = k, d.stride_y = n, d.w_rows_per_batch = n;
    d.split_batch = w.whole_rows / n;  // a share of the groups: the whole matrix's group count
    if (decode_gemv(d, m, s)) return;
    if (wgmma_linear_applies(m, k)) {
      for (int64_t gi = 0; gi < groups; ++gi) {
        wgmma_linear(x + gi * k, groups * k, v, gi * n, m, k, n, y + gi * n, groups * n, false, s);
      }
      return;
    }
    kc::TcGemm g;
    g.a = x, g.lda = groups * k, g.b = v;
    g.c = y, g.ldc = groups * n, g.m = m, g.n = n, g.k = k;
    g.batch = groups, g.stride_a = k, g.b_rows_per_batch = n, g.stride_c = n;
    DSV41RT_CU(kc::gemm_bf16_tc(g, cs(s)));
  }
  void rms_norm(const float* x, const float* weight, int64_t rows, int64_t dim, float eps, float* y,
                Stream s) override {
    DSV41RT_CU(kc::rms_norm(x, weight, rows, dim, eps, y, cs(s)));
  }
  void apply_rope(float* x, int64_t rows, int64_t heads, int64_t head_dim, int64_t rope_dim,
                  const int64_t* positions, const float* inv_freq, bool inverse,
                  Stream s) override {
    DSV41RT_CU(
        kc::apply_rope(x, rows, heads, head_dim, rope_dim, positions, inv_freq, inverse, cs(s)));
  }
  void hc_mix(const float* X, const float* fn, const float* base, const float* scale, int64_t S,
              int64_t n, int64_t H, float rms_eps, float hc_eps, int iters, float* pre, float* post,
              float* comb, Scratch scratch, Stream s) override {
    const int64_t bytes = kc::hc_mix_workspace_bytes(S, n, H);
    DSV41RT_CU(kc::hc_mix(X, fn, base, scale, S, n, H, rms_eps, hc_eps, iters, pre, post, comb,
                          scratch.get(bytes), bytes, cs(s)));
  }
  void hc_collapse(const float* X, const float* w, int64_t S, int64_t n, int64_t H, float* u,
                   Stream s) override {
    DSV41RT_CU(kc::hc_collapse(X, w, S, n, H, u, cs(s)));
  }
  void hc_head_pre(const float* X, const float* fn, const float* base, const float* scale,
                   int64_t S, int64_t n, int64_t H, float rms_eps, float hc_eps, float* pre,
                   Stream s) override {
    DSV41RT_CU(kc::hc_head_pre(X, fn, base, scale, S, n, H, rms_eps, hc_eps, pre, cs(s)));
  }
  void hc_expand(const float* X, const float* y, const float* post, const float* comb, int64_t S,
                 int64_t n, int64_t H, float* out, Stream s) override {
    DSV41RT_CU(kc::hc_expand(X, y, post, comb, S, n, H, out, cs(s)));
  }
  void embed_rows(const float* table_f32, const uint16_t* table_bf16, const int32_t* tokens,
                  int64_t n, int64_t H, int64_t copies, float* X, Stream s) override {
    DSV41RT_CU(kc::embed_rows(table_f32, table_bf16, tokens, n, H, copies, X, cs(s)));
  }
  void engram_gather(const uint8_t* table, const uint8_t* scales, const int64_t* rows, int64_t n,
                     int64_t hd, float* out, Stream s) override {
    DSV41RT_CU(kc::engram_gather(table, scales, rows, n, hd, out, cs(s)));
  }
  void engram_forward(float* X, const float* emb, const Matrix& wkv, const float* q_weight,
                      const float* k_weight, int64_t S, int64_t n, int64_t H, int64_t D, float eps,
                      Scratch scratch, Stream s) override {
    const kernels::WeightView v = wkv.view((n + 1) * H, D);
    float* ws = static_cast<float*>(scratch.get(kc::engram_forward_workspace(S, n, H) * 4));
    const bool kv_ready = engram_kv_tensor_cores(emb, wkv, S, (n + 1) * H, D, ws, s);
    DSV41RT_CU(kc::engram_forward(X, emb, v, q_weight, k_weight, nullptr, S, n, H, D, eps, ws,
                                  cs(s), kv_ready));
  }
  void moe_route(const float* x, const float* gate, const float* bias, int64_t S, int64_t H,
                 int64_t E, int64_t k, float scale, bool normalize, int32_t* idx, float* weight,
                 Stream s) override {
    DSV41RT_CU(kc::moe_route(x, gate, bias, S, H, E, k, scale, normalize, idx, weight, cs(s)));
  }
  // Token ids are the plan's int32 device array, read as they are (the CPU widens them on the
  // host); kernels/cuda/v4_hash_route.cuh says what an id the planner would refuse gives.
  void moe_route_hash(const float* x, const float* gate, const int32_t* tid2eid,
                      const int32_t* tokens, int64_t S, int64_t H, int64_t E, int64_t k,
                      int64_t vocab, float scale, int32_t* idx, float* weight, Stream s) override {
    DSV41RT_CU(
        kc::moe_route_hash(x, gate, tid2eid, tokens, S, H, E, k, vocab, scale, idx, weight, cs(s)));
  }
  void moe_experts(const float* x, const int32_t* idx, const float* weight, int64_t S, int64_t H,
                   int64_t k, int64_t E, int64_t I, const LayerWeights& w, float limit, float* y,
                   Scratch scratch, Stream s) override;
  // Expert parallelism by partial sums: every expert kernel skips the ids outside its stack.
  ExpertSplit expert_split() const override { return ExpertSplit::kPartialSums; }
  void moe_local_ids(const int32_t* idx, int64_t n, int64_t begin, int64_t count, int32_t* out,
                     Stream s) override {
    DSV41RT_CU(kc::moe_local_ids(idx, n, begin, count, out, cs(s)));
  }
  void moe_expert_slots(const float*, const int32_t*, const float*, int64_t, int64_t, int64_t,
                        int64_t, int64_t, const LayerWeights&, float, float*, Scratch,
                        Stream) override {
    DSV41RT_THROW_CODE(kUnsupported, "the CUDA backend splits experts by partial sums");
  }
  void moe_combine(const float*, const int32_t*, const float*, int64_t, int64_t, int64_t, int64_t,
                   const LayerWeights&, float, float*, Scratch, Stream) override {
    DSV41RT_THROW_CODE(kUnsupported, "the CUDA backend splits experts by partial sums");
  }
  void cache_qdq(RowFormat f, float* x, int64_t rows, int64_t dim, Stream s) override {
    if (f == RowFormat::kV4Row) DSV41RT_CU(kc::v4_row_qdq(x, rows, dim, x, cs(s)));
    if (f == RowFormat::kFp8Window) DSV41RT_CU(kc::fp8_window_qdq(x, rows, dim, x, cs(s)));
    if (f == RowFormat::kNvfp4) DSV41RT_CU(kc::nvfp4_qdq(x, rows, dim, x, cs(s)));
    if (f == RowFormat::kMxfp4) DSV41RT_CU(kc::mxfp4_qdq(x, rows, dim, x, cs(s)));
  }
  void unpack_paged(RowFormat f, const kernels::PagedRows& src, int64_t dim, int64_t items,
                    int64_t max_count, const int64_t* count, const int64_t* out_offset, float* out,
                    Stream s) override {
    DSV41RT_CU(kc::unpack_paged(f, src, dim, items, max_count, count, out_offset, out, cs(s)));
  }
  void pack_paged(RowFormat f, const kernels::PagedRows& dst, int64_t dim, int64_t n,
                  const float* rows, const int32_t* item, const int64_t* entry, Stream s) override {
    DSV41RT_CU(kc::pack_paged(f, dst, dim, n, rows, item, entry, cs(s)));
  }
  void unpack_ring(RowFormat f, const kernels::RingRows& src, int64_t dim, int64_t items,
                   int64_t max_count, const int64_t* first, const int64_t* count,
                   const int64_t* out_offset, float* out, Stream s) override {
    DSV41RT_CU(
        kc::unpack_ring(f, src, dim, items, max_count, first, count, out_offset, out, cs(s)));
  }
  void pack_ring(RowFormat f, const kernels::RingRows& dst, int64_t dim, int64_t n,
                 const float* rows, const int32_t* item, const int64_t* positions,
                 const uint8_t* store, Stream s) override {
    DSV41RT_CU(kc::pack_ring(f, dst, dim, n, rows, item, positions, store, cs(s)));
  }
  void compress_pool_gather(const float* values, const float* scores, uint8_t* const* slots,
                            int64_t pending_offset, int64_t groups, int64_t ratio, int64_t D,
                            const int32_t* group_item, const int64_t* n_pending,
                            const int64_t* first_row, float* pooled, Stream s) override {
    DSV41RT_CU(kc::compress_pool_gather(values, scores, slots, pending_offset, groups, ratio, D,
                                        group_item, n_pending, first_row, pooled, cs(s)));
  }
  void store_pending(const float* values, const float* scores, uint8_t* const* slots,
                     int64_t pending_offset, int64_t ratio, int64_t D, int64_t n,
                     const int32_t* item, const int64_t* src_row, const int64_t* dst_row,
                     Stream s) override {
    DSV41RT_CU(kc::store_pending(values, scores, slots, pending_offset, ratio, D, n, item, src_row,
                                 dst_row, cs(s)));
  }
  void v4_compress(const kernels::V4CompressorWeights& w, const float* a, const float* s,
                   uint8_t* const* slots, int64_t state_offset, int64_t items,
                   const int64_t* length, const int64_t* row0, const int64_t* n,
                   const int64_t* entry0, float* entries, Stream stream) override {
    DSV41RT_CU(kc::v4_compress_paged(w, a, s, slots, state_offset, items, length, row0, n, entry0,
                                     entries, cs(stream)));
  }
  // The V4-only ops run as FP32 kernels (kernels/cuda/v4_*.cuh); V4 itself is limited to
  // precision fp32 on every backend (v4_support.cc check_v4_options).
  bool has_v4_ops() const override { return true; }
  void attention_indices(int64_t S, int64_t W, int64_t KI, const int32_t* row_item,
                         const int64_t* positions, const int64_t* window_first,
                         const int64_t* length, const int64_t* old_offset, const int64_t* row0,
                         int64_t new_offset, const int32_t* topk, const int64_t* comp_offset,
                         int64_t comp_base, int32_t* idx, Stream s) override {
    DSV41RT_CU(kc::attention_indices(S, W, KI, row_item, positions, window_first, length,
                                     old_offset, row0, new_offset, topk, comp_offset, comp_base,
                                     idx, cs(s)));
  }
  void indexer_scores(const float* q, const float* keys, const int64_t* key_offset, const float* w,
                      const int64_t* n_visible, int64_t S, int64_t H, int64_t D, int64_t T,
                      bool values_bf16, float* scores, Stream s) override {
    // Tensor cores when the values are BF16 (the MXFP4 index caches), every regime: the kernel
    // needs no workspace and a row's bits depend on its own query only.
    if (values_bf16 && kc::indexer_scores_tc_supported(H, D, q, keys)) {
      DSV41RT_CU(
          kc::indexer_scores_tc(q, keys, key_offset, w, n_visible, S, H, D, T, scores, cs(s)));
      return;
    }
    DSV41RT_CU(
        kc::indexer_scores_offset(q, keys, key_offset, w, n_visible, S, H, D, T, scores, cs(s)));
  }
  void candidate_blocks(const float* scores, const int64_t* n_visible, int64_t S, int64_t T,
                        int64_t topk_blocks, int64_t block_size, uint8_t* mask, Stream s) override {
    DSV41RT_CU(kc::candidate_blocks(scores, n_visible, S, T, topk_blocks, block_size, mask, cs(s)));
  }
  void apply_candidate_mask(float* scores, const uint8_t* mask, int64_t n, Stream s) override {
    DSV41RT_CU(kc::apply_candidate_mask(scores, mask, n, cs(s)));
  }
  void topk_select(const float* scores, int64_t S, int64_t T, int64_t k, int32_t* idx,
                   Stream s) override {
    DSV41RT_CU(kc::topk_select(scores, S, T, k, idx, cs(s)));
  }
  void walsh_hadamard(const float* x, int64_t rows, int64_t dim, float* y, Stream s) override {
    DSV41RT_CHECK(dim >= 1 && (dim & (dim - 1)) == 0 && dim <= kc::kMaxHadamardDim,
                  "walsh_hadamard: dim ", dim, " is not a power of two up to ", kc::kMaxHadamardDim,
                  " (the CUDA kernel stages a row in shared memory)");
    DSV41RT_CU(kc::walsh_hadamard(x, rows, dim, y, cs(s)));
  }
  void visible_entries(const int64_t* n_visible, int64_t S, int64_t k, int32_t* idx,
                       Stream s) override {
    DSV41RT_CU(kc::visible_entries(n_visible, S, k, idx, cs(s)));
  }
  void sparse_attention(const float* q, const float* kv_a, int64_t T_a, const float* kv_b,
                        int64_t T_b, const int32_t* idx, const float* sink, int64_t S,
                        int64_t n_heads, int64_t D, int64_t K, float scale, bool keys_bf16,
                        float* out, Stream s) override {
    // Tensor cores when the keys are BF16 values (the quantised caches); the FP32 CUDA-core
    // kernel for FP32 caches (kv_cache_dtype fp32), shapes the tensor-core kernel does not take,
    // and precision bf16: there the GPU-vs-emulation gate failed with it (n 37: 1.77e-3 vs
    // 1.09e-2 to FP32; bench/results/2026-12-02-h200-attention-tc.md) while fp32 and fp8 pass.
    const bool bf16_mode = tc_ && !fp8_;
    if (keys_bf16 && !bf16_mode && kc::sparse_attention_tc_supported(D, q, kv_a, kv_b)) {
      // Prefill-like forwards (never captured) in precision fp8 take the throughput kernel;
      // precision fp32 keeps one kernel for every forward, so a row's bits do not depend on how
      // the prompt was chunked or batched (tests/python/test_cuda_executor.py).
      if (staged_gemm_ && fp8_) {
        void* ws =
            eager_workspace(attn_keys_[stream_index(s)],
                            int64_t(kc::sparse_attention_prefill_tc_workspace(T_a, T_b, D)), s);
        DSV41RT_CU(kc::sparse_attention_prefill_tc(q, kv_a, T_a, kv_b, T_b, idx, sink, S, n_heads,
                                                   D, K, scale, ws, out, cs(s)));
        return;
      }
      DSV41RT_CU(kc::sparse_attention_tc(q, kv_a, T_a, kv_b, T_b, idx, sink, S, n_heads, D, K,
                                         scale, out, cs(s)));
      return;
    }
    DSV41RT_CU(kc::sparse_attention_split(q, kv_a, T_a, kv_b, T_b, idx, sink, S, n_heads, D, K,
                                          scale, out, cs(s)));
  }
  // In place in decode-sized forwards and decode batches where sparse_attention would run the
  // tensor-core latency kernel (which then stages the stored rows itself: the same bits).
  bool attention_reads_caches(bool keys_bf16, int64_t D) const override {
    const bool bf16_mode = tc_ && !fp8_;
    return keys_bf16 && !bf16_mode && !staged_gemm_ &&
           kc::sparse_attention_tc_supported(D, nullptr, nullptr, nullptr);
  }
  // The in-place row decode (cache_row_decode.cuh) has V4.1's formats; DeepSeek-V4's 584-byte
  // rows are unpacked first (paged.cu's kV4Row codec: the same bits).
  bool attention_reads_format(RowFormat format) const override {
    return format != RowFormat::kV4Row;
  }
  void sparse_attention_cached(const float* q, const kernels::CachedKeys& keys, const int32_t* idx,
                               const float* sink, int64_t S, int64_t n_heads, int64_t D, int64_t K,
                               float scale, float* out, Stream s) override {
    // The device row decode (cache_row_decode.cuh) knows V4.1's formats only: V4's rows reach
    // the attention unpacked (attention_reads_format).
    DSV41RT_CHECK_CODE(
        kUnsupported,
        keys.window_format != RowFormat::kV4Row && keys.comp_format != RowFormat::kV4Row,
        "sparse_attention_cached: DeepSeek-V4's 584-byte cache rows (kV4Row) are not decoded in "
        "place on cuda (attention_reads_format)");
    DSV41RT_CU(
        kc::sparse_attention_tc_cached(q, keys, idx, sink, S, n_heads, D, K, scale, out, cs(s)));
  }
  // Decode-sized forwards and decode batches (like the attention): a step's few queries per
  // request then read 68-byte MXFP4 rows instead of an unpack writing and the kernel reading
  // 512-byte FP32 ones (bench-40 B 64 at 32k, with the top-k change of the same run: 78.9 ->
  // 65.7 ms per step). A prefill's thousands of queries per request re-decode every row: on a
  // 32k prefill the scores took 942 ms in place against 882 ms over the unpacked keys (H200,
  // single runs).
  bool indexer_reads_caches(kernels::RowFormat format, int64_t H, int64_t D) const override {
    return format != kernels::RowFormat::kF32 && format != kernels::RowFormat::kV4Row &&
           !staged_gemm_ && kc::indexer_scores_tc_supported(H, D, nullptr, nullptr);
  }
  void indexer_scores_cached(const float* q, const kernels::IndexKeys& keys, const float* w,
                             const int64_t* n_visible, int64_t S, int64_t H, int64_t D, int64_t T,
                             float* scores, Stream s) override {
    DSV41RT_CU(kc::indexer_scores_tc_cached(q, keys, w, n_visible, S, H, D, T, scores, cs(s)));
  }
  void gather_rows(const float* src, const int64_t* rows, int64_t n, int64_t dim, float* dst,
                   Stream s) override {
    DSV41RT_CU(kc::gather_rows(src, rows, n, dim, dst, cs(s)));
  }
  void scale(float* x, int64_t n, float factor, Stream s) override {
    DSV41RT_CU(kc::scale_inplace(x, n, factor, cs(s)));
  }
  void mask_tokens(float* logits, const int64_t* rows, int64_t n, int64_t V, const uint32_t* words,
                   Stream s) override {
    DSV41RT_CU(kc::mask_tokens(logits, rows, n, V, words, cs(s)));
  }
  void sample(const float* logits, const int64_t* logit_rows, int64_t rows, int64_t V,
              const kernels::SamplingParams* params, const int32_t* history,
              const int64_t* prompt_off, const int64_t* output_off, const uint64_t* steps,
              int32_t* tokens, float* logprobs, int32_t max_top, int32_t* top_ids,
              float* top_logprobs, Scratch scratch, Stream s) override {
    void* ws = scratch.get(rows * kc::sampling_workspace_bytes(V));
    DSV41RT_CU(kc::sample_token(logits, logit_rows, rows, V, params, history, prompt_off, history,
                                output_off, steps, ws, tokens, logprobs, max_top, top_ids,
                                top_logprobs, cs(s)));
  }

 private:
  cudaEvent_t event(int id) {
    auto& e = events_[id];
    if (!e) e = std::make_unique<cudart::Event>();
    return e->get();
  }

  int device_ = 0;
  // main, window store, compressor, indexer (the streams linears and attention run on: one
  // workspace of each kind per stream below), then the mHC mix stream (no linears).
  static constexpr size_t kLinearStreams = 4;
  std::array<std::unique_ptr<cudart::Stream>, kLinearStreams + 1> streams_;
  std::map<int, std::unique_ptr<cudart::Event>> events_;
  std::map<int, std::unique_ptr<cudart::TimingEvent>> timing_;
  // The skinny decode kernels take forwards of at most this many rows (a power of two: a decode
  // graph bucket never straddles it).
  static constexpr int64_t kDecodeMaxRows = kDecodeForwardRows;
  static_assert(kc::kDecodeGemvMaxM == kDecodeForwardRows,
                "the decode GEMV serves every decode row");
  bool decode_gemv(kc::DecodeGemv d, int64_t m, Stream s);
  // split_n: Matrix::whole_rows of a tensor-parallel share (0: the matrix is whole).
  bool decode_gemv_a8(const float* x, const kernels::WeightView& v, int64_t m, int64_t k, int64_t n,
                      float* y, bool accumulate, Stream s, int64_t split_n = 0);
  const float* fp8_act_qdq(const float* x, int64_t rows, int64_t k, Stream s);
  bool wgmma_linear_applies(int64_t m, int64_t k) const;
  bool engram_kv_tensor_cores(const float* emb, const Matrix& wkv, int64_t S, int64_t kvw,
                              int64_t D, float* kv, Stream s);
  // fp8_qdq: x is the raw FP32 input of a precision-"fp8" linear; its QDQ is fused into the BF16
  // staging (false, nothing enqueued, where fp8_staging_fused does not hold).
  bool wgmma_linear(const float* x, int64_t ldx, const kernels::WeightView& v, int64_t row0,
                    int64_t m, int64_t k, int64_t n, float* y, int64_t ldy, bool accumulate,
                    Stream s, bool fp8_qdq = false);
  static bool fp8_staging_fused(const float* x, int64_t ldx, int64_t k);
  void* eager_workspace(DeviceArray<uint8_t>& array, int64_t bytes, Stream s);
  void size_gemv_workspaces(const BackendWeights& w, const ModelConfig& c);
  size_t stream_index(Stream s) const;
  float* gemv_workspace(Stream s, int64_t floats);
  void* act_workspace(Stream s, int64_t bytes);

  // staged_gemm_: this forward may take the wgmma GEMMs, whose staging workspaces grow with the
  // forward (neither decode-sized nor a decode batch: never under graph capture).
  bool tc_ = false, fp8_ = false, decode_forward_ = false, staged_gemm_ = true;
  bool programmatic_launch_ = false;  // set per decode graph by the executor
  int64_t programmatic_edges_ = 0;    // over every capture: how many edges were made programmatic
  bool engram_host_ = false;  // the next load_weights keeps the Engram tables in host memory
  // Split-K partials of the decode GEMV, one per stream (ops on different streams overlap);
  // sized at load for every matrix of the model, so they never move under a captured graph.
  std::array<DeviceArray<float>, kLinearStreams> gemv_ws_;
  // Precision "fp8": the quantised activations of a linear, one per stream; act_ws_ sized at load
  // for decode-sized forwards (never moves under a captured graph), act_grown_ for larger ones
  // (eager forwards only).
  std::array<DeviceArray<uint8_t>, kLinearStreams> act_ws_, act_grown_;
  // The BF16 operands of the wgmma prefill GEMM (activations; a chunk of decoded weight rows),
  // one pair per stream; prefill-sized forwards only (never captured).
  std::array<DeviceArray<uint8_t>, kLinearStreams> wgmma_a_, wgmma_b_;
  // The prefill attention kernel's BF16 copy of the key arrays, per stream (eager forwards only).
  std::array<DeviceArray<uint8_t>, kLinearStreams> attn_keys_;
  uint64_t wgmma_generation_ = 0;
  uint64_t gemv_generation_ = 0;
  int64_t d2h_bytes_ = 0, graph_updates_ = 0;
};

}  // namespace dsv41rt::model::cuda_backend_detail
