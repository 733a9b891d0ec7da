// The CUDA backend's factory and the members that choose a linear's kernel (decode GEMV, FP8
// decode GEMV, wgmma, tiled GEMM), size its workspaces and run the MoE; the class itself is in
// cuda_backend_impl.h. Built with DSV41RT_WITH_CUDA.
#include <algorithm>
#include <vector>

#include "runtime/model/cuda_backend_impl.h"

namespace dsv41rt::model {
namespace cuda_backend_detail {

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

// Whether fp8_act_qdq_bf16 stages x (row stride ldx) into the wgmma workspace (256-byte aligned,
// row stride k).
bool CudaBackend::fp8_staging_fused(const float* x, int64_t ldx, int64_t k) {
  static const uint16_t* const kAligned = reinterpret_cast<const uint16_t*>(uintptr_t(256));
  return kc::fp8_act_qdq_bf16_supported(x, ldx, k, kAligned, k);
}

bool CudaBackend::wgmma_linear(const float* x, int64_t ldx, const kernels::WeightView& v,
                               int64_t row0, int64_t m, int64_t k, int64_t n, float* y, int64_t ldy,
                               bool accumulate, Stream s, bool fp8_qdq) {
  if (!wgmma_linear_applies(m, k) || v.format == WeightFormat::kF32) return false;
  if (fp8_qdq && !fp8_staging_fused(x, ldx, k)) return false;
  const size_t i = stream_index(s);
  auto* a = static_cast<uint16_t*>(eager_workspace(wgmma_a_[i], m * k * 2, s));
  // Precision fp8: the activation QDQ and the BF16 staging in one pass (bitwise the two passes).
  DSV41RT_CU(fp8_qdq ? kc::fp8_act_qdq_bf16(x, ldx, m, k, a, k, cs(s))
                     : kc::rows_to_bf16(x, ldx, m, k, a, k, cs(s)));
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
  while (i < kLinearStreams && streams_[i]->get() != cs(s)) ++i;
  DSV41RT_CHECK_CODE(kInternal, i < kLinearStreams,
                     "a linear or attention on a stream without its workspaces");
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

}  // namespace cuda_backend_detail

std::unique_ptr<Backend> make_cuda_backend(const std::string& device) {
  return std::make_unique<cuda_backend_detail::CudaBackend>(device);
}

}  // namespace dsv41rt::model
