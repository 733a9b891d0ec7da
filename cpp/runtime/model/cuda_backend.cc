// The CUDA backend: the kernels of kernels/cuda on a main stream and three side streams, device
// memory from cudaMalloc, decode graphs through stream capture (updated in place with
// cudaGraphExecUpdate when only addresses changed). Built with DSV41RT_WITH_CUDA.
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

namespace dsv41rt::model {
namespace {

namespace kc = kernels::cuda;

using kernels::RowFormat;

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

cudaStream_t cs(Stream s) { return static_cast<cudaStream_t>(s.handle); }

// Shapes the CUDA kernels do not take (kernels/cuda/attention.cuh, moe.cuh), refused at load
// rather than at the first forward.
void check_kernel_shapes(const ModelConfig& c) {
  DSV41RT_CHECK_CODE(kUnsupported, c.head_dim <= 512 && c.head_dim % 4 == 0, c.source,
                     ": head_dim ", c.head_dim,
                     " is not supported on CUDA (sparse attention needs <= 512, a multiple of 4)");
  int experts = c.n_routed_experts;
  if (c.dspark) experts = std::max(experts, c.dspark->n_routed_experts);
  DSV41RT_CHECK_CODE(kUnsupported, experts <= 1024, c.source, ": ", experts,
                     " routed experts are not supported on CUDA (the router takes <= 1024)");
}
const float* f32(const Matrix& m) { return static_cast<const float*>(m.data); }

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
  void sparse_attention_cached(const float* q, const kernels::CachedKeys& keys, const int32_t* idx,
                               const float* sink, int64_t S, int64_t n_heads, int64_t D, int64_t K,
                               float scale, float* out, Stream s) override {
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
    return format != kernels::RowFormat::kF32 && !staged_gemm_ &&
           kc::indexer_scores_tc_supported(H, D, nullptr, nullptr);
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
  std::array<std::unique_ptr<cudart::Stream>, 4>
      streams_;  // main, window store, compressor, indexer
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
  bool wgmma_linear(const float* x, int64_t ldx, const kernels::WeightView& v, int64_t row0,
                    int64_t m, int64_t k, int64_t n, float* y, int64_t ldy, bool accumulate,
                    Stream s);
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
  std::array<DeviceArray<float>, 4> gemv_ws_;
  // Precision "fp8": the quantised activations of a linear, one per stream; act_ws_ sized at load
  // for decode-sized forwards (never moves under a captured graph), act_grown_ for larger ones
  // (eager forwards only).
  std::array<DeviceArray<uint8_t>, 4> act_ws_, act_grown_;
  // The BF16 operands of the wgmma prefill GEMM (activations; a chunk of decoded weight rows),
  // one pair per stream; prefill-sized forwards only (never captured).
  std::array<DeviceArray<uint8_t>, 4> wgmma_a_, wgmma_b_;
  // The prefill attention kernel's BF16 copy of the key arrays, per stream (eager forwards only).
  std::array<DeviceArray<uint8_t>, 4> attn_keys_;
  uint64_t wgmma_generation_ = 0;
  uint64_t gemv_generation_ = 0;
  int64_t d2h_bytes_ = 0, graph_updates_ = 0;
};

// y rows [0, m) through the decode GEMV in chunks of at most kDecodeGemvMaxM rows (its summation
// order does not depend on m, so chunking changes nothing); false when this forward is not
// decode-sized or the kernel does not take the matrix (then the tiled GEMM runs).
bool CudaBackend::decode_gemv(kc::DecodeGemv d, int64_t m, Stream s) {
  d.m = std::min<int64_t>(m, kc::kDecodeGemvMaxM);
  if (!decode_forward_ || m < 1 || !kc::decode_gemv_supported(d)) return false;
  float* ws = gemv_workspace(s, kc::decode_gemv_workspace_floats(d));
  const int64_t ws_floats = kc::decode_gemv_workspace_floats(d);
  for (int64_t r0 = 0; r0 < m; r0 += kc::kDecodeGemvMaxM) {
    kc::DecodeGemv c = d;
    c.m = std::min<int64_t>(m - r0, kc::kDecodeGemvMaxM);
    c.x = d.x + r0 * d.ldx;
    c.y = d.y + r0 * d.ldy;
    DSV41RT_CU(kc::decode_gemv_bf16(c, ws, ws_floats, cs(s)));
  }
  return true;
}

// Precision "fp8", decode-sized forwards, FP8-block matrices: the activation quantised once
// (quantize_act_fp8) and multiplied on the FP8 tensor cores (decode_gemv_a8.cuh); false when the
// kernel does not take this matrix or forward (the caller then dequantises and goes on).
bool CudaBackend::decode_gemv_a8(const float* x, const kernels::WeightView& v, int64_t m, int64_t k,
                                 int64_t n, float* y, bool accumulate, Stream s, int64_t split_n) {
  if (!decode_forward_ || m < 1 || m > kc::kDecodeGemvA8MaxM) return false;
  kc::DecodeGemvA8 g;
  g.ldq = (kc::act_fp8_row_bytes(k) + 15) / 16 * 16;
  g.w = v, g.y = y, g.ldy = n, g.m = m, g.n = n, g.k = k, g.accumulate = accumulate;
  g.split_n = split_n;
  static const uint8_t* const kAligned = reinterpret_cast<const uint8_t*>(uintptr_t(256));
  g.xq = kAligned;  // the real buffer is taken below, once the kernel is known to apply
  if (!kc::decode_gemv_a8_supported(g)) return false;
  uint8_t* q = static_cast<uint8_t*>(act_workspace(s, m * g.ldq));
  g.xq = q;
  DSV41RT_CU(kc::quantize_act_fp8(x, m, k, k, q, g.ldq, cs(s)));
  const int64_t floats = kc::decode_gemv_a8_workspace_floats(g);
  DSV41RT_CU(kc::decode_gemv_a8(g, gemv_workspace(s, floats), floats, cs(s)));
  return true;
}

// x [rows, k] through the FP8 activation QDQ into this stream's activation workspace.
const float* CudaBackend::fp8_act_qdq(const float* x, int64_t rows, int64_t k, Stream s) {
  float* q = static_cast<float*>(act_workspace(s, rows * k * int64_t(sizeof(float))));
  DSV41RT_CU(kc::fp8_act_qdq(x, rows, k, q, cs(s)));
  return q;
}

// Forwards that are not decode-sized: the wgmma GEMM on BF16 operands staged here
// (gemm_wgmma.cuh; the values gemm_tc would multiply, summed in another order). Every linear of
// such a forward takes it, whatever its m, so a row's bits do not depend on how many rows the
// forward has (the tiled GEMM stays for k % 8 != 0).
// Weight rows are decoded to BF16 in chunks of about this many bytes (the workspace's size).
constexpr int64_t kWgmmaWeightChunkBytes = int64_t(256) << 20;

bool CudaBackend::wgmma_linear_applies(int64_t m, int64_t k) const {
  return staged_gemm_ && m > 0 && k % 8 == 0;
}

bool CudaBackend::wgmma_linear(const float* x, int64_t ldx, const kernels::WeightView& v,
                               int64_t row0, int64_t m, int64_t k, int64_t n, float* y, int64_t ldy,
                               bool accumulate, Stream s) {
  if (!wgmma_linear_applies(m, k) || v.format == WeightFormat::kF32) return false;
  const size_t i = stream_index(s);
  auto* a = static_cast<uint16_t*>(eager_workspace(wgmma_a_[i], m * k * 2, s));
  DSV41RT_CU(kc::rows_to_bf16(x, ldx, m, k, a, k, cs(s)));
  const int64_t chunk =
      std::min(n, std::max<int64_t>(128, kWgmmaWeightChunkBytes / (k * 2) / 128 * 128));
  auto* b = static_cast<uint16_t*>(eager_workspace(wgmma_b_[i], chunk * k * 2, s));
  for (int64_t n0 = 0; n0 < n; n0 += chunk) {
    const int64_t rows = std::min(chunk, n - n0);
    DSV41RT_CU(kc::weight_to_bf16(v, row0 + n0, rows, b, k, cs(s)));
    kc::WgmmaGemm g;
    g.a = a, g.lda = k, g.b = b, g.ldb = k, g.c = y + n0, g.ldc = ldy;
    g.m = m, g.n = rows, g.k = k, g.accumulate = accumulate;
    DSV41RT_CU(kc::gemm_bf16_wgmma(g, cs(s)));
  }
  return true;
}

// The Engram kv projection in precision fp8, on tensor cores: the matrix as stored (FP8 32 x 32 on
// release) through linear()'s BF16 path (decode GEMV, wgmma or tiled GEMM by the forward's rows).
// Its products are the reference's: emb holds decoded FP8 table rows, exact in BF16 and unchanged
// by the 1 x 32 FP8 requantisation of spec 5.2 (each table block of 32 channels already shares one
// power-of-two scale), and the weights decode exactly, so only the FP32 summation order differs
// from the CPU emulation's FP32 dot. The CUDA-core kernel (one warp per output) read an FP32 copy
// of the matrix (4x its bytes) and took 6.6 ms per call at 64 decode rows on the H200 (session 25).
// Precision fp32 keeps that kernel: its rows stay bitwise the same at every batch size
// (prefix-cache hits re-run short suffixes), which the tensor-core sum order is not. Precision
// bf16 keeps it too: with a tensor-core path its GPU-vs-emulation gate failed at 200 tokens on the
// H200 (session 18: that gate fails for any FP32-level change of this projection).
bool CudaBackend::engram_kv_tensor_cores(const float* emb, const Matrix& wkv, int64_t S,
                                         int64_t kvw, int64_t D, float* kv, Stream s) {
  if (!tc_ || !fp8_ || !wkv.bf16_exact || wkv.format == WeightFormat::kF32 || S < 1) return false;
  Matrix a16 = wkv;
  a16.fp8_input = false;  // the requantisation is the identity here (above)
  linear(emb, a16, S, D, kvw, kv, false, s);
  return true;
}

// A workspace of the staged (prefill) GEMMs and the prefill attention: used by eager forwards only,
// since it may grow with the next forward and a graph would keep its old address.
void* CudaBackend::eager_workspace(DeviceArray<uint8_t>& array, int64_t bytes, Stream s) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  DSV41RT_CU(cudaStreamIsCapturing(cs(s), &st));
  DSV41RT_CHECK_CODE(kInternal, st == cudaStreamCaptureStatusNone,
                     "a staged (prefill) GEMM or attention ran under graph capture: decode "
                     "batches must not take it (Backend::set_forward_rows)");
  return array.ensure([](int64_t b) { return cudart::device_alloc(b); },
                      std::max<int64_t>(bytes, 1), wgmma_generation_);
}

size_t CudaBackend::stream_index(Stream s) const {
  size_t i = 0;
  while (i < streams_.size() && streams_[i]->get() != cs(s)) ++i;
  DSV41RT_CHECK_CODE(kInternal, i < streams_.size(), "a linear on a foreign stream");
  return i;
}

void* CudaBackend::act_workspace(Stream s, int64_t bytes) {
  const size_t i = stream_index(s);
  if (bytes <= act_ws_[i].capacity()) return act_ws_[i].get();
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  DSV41RT_CU(cudaStreamIsCapturing(cs(s), &st));
  DSV41RT_CHECK_CODE(kInternal, st == cudaStreamCaptureStatusNone,
                     "FP8 activation workspace would grow during graph capture");
  return act_grown_[i].ensure([](int64_t b) { return cudart::device_alloc(b); }, bytes,
                              gemv_generation_);
}

float* CudaBackend::gemv_workspace(Stream s, int64_t floats) {
  DeviceArray<float>& a = gemv_ws_[stream_index(s)];
  if (floats > a.capacity()) {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    DSV41RT_CU(cudaStreamIsCapturing(cs(s), &st));
    // Load sizes these for every matrix of the model; only op-level callers grow them, eagerly.
    DSV41RT_CHECK_CODE(kInternal, st == cudaStreamCaptureStatusNone,
                       "decode GEMV workspace would grow during graph capture");
  }
  return a.ensure([](int64_t b) { return cudart::device_alloc(b); }, std::max<int64_t>(floats, 1),
                  gemv_generation_);
}

// The largest split-K workspace any matrix of the model needs at the largest decode chunk (BF16
// and FP8 activations), and the largest decode-sized FP8 activation (the grouped wo_a input, of
// num_attention_heads * head_dim columns, included).
void CudaBackend::size_gemv_workspaces(const BackendWeights& w, const ModelConfig& c) {
  int64_t most = 1, act = c.num_attention_heads * c.head_dim;
  auto visit = [&](const Matrix& mat) {
    if (!mat || mat.rows == 0) return;
    kc::DecodeGemv d;
    d.w = mat.view(mat.rows, mat.cols);
    d.m = kc::kDecodeGemvMaxM, d.n = mat.rows, d.k = mat.cols, d.ldx = mat.cols, d.ldy = mat.rows;
    most = std::max(most, kc::decode_gemv_workspace_floats(d));
    kc::DecodeGemvA8 g;
    g.w = d.w, g.m = kc::kDecodeGemvA8MaxM, g.n = mat.rows, g.k = mat.cols, g.ldy = mat.rows;
    most = std::max(most, kc::decode_gemv_a8_workspace_floats(g));
    act = std::max(act, mat.cols);
  };
  visit(w.head);
  for (const Matrix* m :
       {&w.draft_heads.main_proj, &w.draft_heads.markov_head, &w.draft_heads.confidence}) {
    visit(*m);
  }
  std::vector<const LayerWeights*> blocks;
  for (const LayerWeights& L : w.layers) blocks.push_back(&L);
  for (const LayerWeights& L : w.drafts) blocks.push_back(&L);
  for (const LayerWeights* block : blocks) {
    const LayerWeights& L = *block;
    for (const Matrix* m :
         {&L.wq_a, &L.wq_b, &L.wkv, &L.wo_a, &L.wo_b, &L.comp_wkv, &L.comp_wgate, &L.idx_wq_b,
          &L.idx_weights_proj, &L.idx_wk, &L.idx_comp_wkv, &L.idx_comp_wgate, &L.shared_w1,
          &L.shared_w3, &L.shared_w2, &L.engram_wkv}) {
      visit(*m);
    }
  }
  for (auto& a : gemv_ws_) {
    a.ensure([](int64_t b) { return cudart::device_alloc(b); }, most, gemv_generation_);
  }
  // FP32 QDQ'd rows are the larger form (packed FP8 rows take k + k / 32 + 16 bytes).
  const int64_t act_bytes = kDecodeMaxRows * (act * int64_t(sizeof(float)) + 16);
  for (auto& a : act_ws_) {
    a.ensure([](int64_t b) { return cudart::device_alloc(b); }, act_bytes, gemv_generation_);
  }
}

// Routed + shared experts of S tokens: tensor cores (expert-grouped rows) where the precision
// allows; FP32 weights on the per-token FP32 kernel; otherwise the FP32 split kernels (any stored
// format, decoded exactly) in passes over at most kMoeSplitFloats of scratch.
void CudaBackend::moe_experts(const float* x, const int32_t* idx, const float* weight, int64_t S,
                              int64_t H, int64_t k, int64_t E, int64_t I, const LayerWeights& w,
                              float limit, float* y, Scratch scratch, Stream s) {
  const bool shared = bool(w.shared_w1);
  const int64_t Is = shared ? I : 0;
  const kernels::WeightView w1 = w.w1.view(E * I, H), w3 = w.w3.view(E * I, H);
  const kernels::WeightView w2 = w.w2.view(E * H, I);
  kernels::WeightView sw1, sw3, sw2;
  if (shared) {
    sw1 = w.shared_w1.view(I, H), sw3 = w.shared_w3.view(I, H), sw2 = w.shared_w2.view(H, I);
  }
  // Precision "fp8": x through the FP8 activation QDQ (into the scratch's tail), the kernels
  // quantise the hidden units.
  const bool fp8 = tc_ && fp8_ && moe_fp8_inputs(w);
  const int64_t x_bytes = fp8 ? (S * H * 4 + 255) / 256 * 256 : 0;
  auto carve = [&](int64_t bytes) {
    uint8_t* base = static_cast<uint8_t*>(scratch.get(bytes + x_bytes));
    if (fp8) {
      float* xq = reinterpret_cast<float*>(base + bytes);
      DSV41RT_CU(kc::fp8_act_qdq(x, S, H, xq, cs(s)));
      x = xq;
    }
    return base;
  };
  if (tc_ && moe_bf16_exact(w) && decode_forward_) {
    kc::MoeDecode p;
    p.x = x, p.idx = idx, p.weight = weight, p.S = S, p.H = H, p.k = k, p.E = E, p.I = I;
    p.Is = Is, p.w1 = w1, p.w3 = w3, p.w2 = w2, p.sw1 = sw1, p.sw3 = sw3, p.sw2 = sw2;
    p.limit = limit, p.y = y, p.fp8_inputs = fp8;
    if (kc::moe_decode_supported(p)) {
      const int64_t bytes = (kc::moe_decode_workspace_bytes(p) + 255) / 256 * 256;
      void* ws = carve(bytes);
      p.x = x;
      DSV41RT_CU(kc::moe_decode_bf16(p, ws, bytes, cs(s)));
      return;
    }
  }
  if (tc_ && moe_bf16_exact(w)) {
    const kc::MoeGroupedSizes sz = kc::moe_grouped_sizes(S, H, k, E, I, Is);
    const int64_t int_bytes = (sz.ints * 4 + 255) / 256 * 256;
    const int64_t bytes = (int_bytes + sz.floats * 4 + 255) / 256 * 256;
    uint8_t* base = carve(bytes);
    kc::MoeGroupedWorkspace ws =
        kc::moe_grouped_carve(reinterpret_cast<int32_t*>(base),
                              reinterpret_cast<float*>(base + int_bytes), S, H, k, E, I, Is);
    if (staged_gemm_) {  // the wgmma GEMMs' BF16 operands (never under graph capture)
      const size_t i = stream_index(s);
      const int64_t a_elems = std::max(S * k * std::max(H, I), S * std::max(H, Is));
      ws.b_bf16_elems = std::max({I * H, Is * H, kWgmmaWeightChunkBytes / 2});
      ws.a_bf16 = static_cast<uint16_t*>(eager_workspace(wgmma_a_[i], a_elems * 2, s));
      ws.b_bf16 = static_cast<uint16_t*>(eager_workspace(wgmma_b_[i], ws.b_bf16_elems * 2, s));
    }
    DSV41RT_CU(kc::moe_grouped_bf16(x, idx, weight, S, H, k, E, I, w1, w3, w2, sw1, sw3, sw2, Is,
                                    limit, y, ws, cs(s), fp8));
    return;
  }
  const bool all_f32 =
      w1.format == WeightFormat::kF32 && (!shared || sw1.format == WeightFormat::kF32);
  if (all_f32) {
    DSV41RT_CU(kc::moe_forward(x, idx, weight, S, H, k, E, I, f32(w.w1), f32(w.w3), f32(w.w2),
                               f32(w.shared_w1), f32(w.shared_w3), f32(w.shared_w2), I, limit, y,
                               cs(s)));
    return;
  }
  constexpr int64_t kMoeSplitFloats = int64_t(64) << 20;  // 256 MiB
  const int64_t per_token = kc::moe_split_workspace_floats(1, k, I, I);
  const int64_t chunk =
      std::clamp<int64_t>(kMoeSplitFloats / per_token, 1, std::max<int64_t>(S, 1));
  float* work = static_cast<float*>(scratch.get(chunk * per_token * 4));
  DSV41RT_CU(kc::moe_forward_split(x, idx, weight, S, H, k, E, I, w1, w3, w2, sw1, sw3, sw2, Is,
                                   limit, y, work, chunk * per_token, cs(s)));
}

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(const std::string& device) {
  return std::make_unique<CudaBackend>(device);
}

}  // namespace dsv41rt::model
