#include "runtime/model/cuda_executor_impl.h"

namespace dsv41rt::model {
namespace cuda_detail {

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
      append_sorted_rows(host.data(), N, k, decisions_["experts_L" + std::to_string(layer.index)]);
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
  // The head runs for every planned row (a fixed launch sequence for graphs); only logits that
  // somebody reads come back to the host.
  bool wanted = false;
  for (const BatchItem& b : batch) wanted = wanted || b.logits;
  std::vector<float> logits(wanted ? f.head_rows.size() * V : 0);  // real rows first when padded
  if (wanted) {
    DSV41RT_CU(cudaMemcpyAsync(logits.data(), logits_.get(), logits.size() * sizeof(float),
                               cudaMemcpyDeviceToHost, main()));
  }
  DSV41RT_CU(cudaEventRecord(st_->t1.get(), main()));
  DSV41RT_CU(cudaStreamSynchronize(main()));
  float ms = 0.0f;
  DSV41RT_CU(cudaEventElapsedTime(&ms, st_->t0.get(), st_->t1.get()));
  if (comm && cp_timing_) read_cp_timing();
  last_forward_us_ = int64_t(double(ms) * 1000.0);
  size_t r = 0;
  for (BatchItem& b : batch) {
    const int64_t count = b.all_logits ? b.n : 1;
    if (b.logits) std::copy(logits.begin() + r * V, logits.begin() + (r + count) * V, b.logits);
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

}  // namespace cuda_detail

std::shared_ptr<Executor> make_cuda_executor(ModelPlan plan, ModelWeights weights,
                                             EngramTables engram, ExecutorOptions options) {
  return std::make_shared<cuda_detail::CudaExecutor>(std::move(plan), std::move(weights),
                                                     std::move(engram), std::move(options));
}

}  // namespace dsv41rt::model
