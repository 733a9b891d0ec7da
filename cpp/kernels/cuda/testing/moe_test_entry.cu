#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cuda/engram.cuh"
#include "kernels/cuda/gemm_tc.cuh"
#include "kernels/cuda/moe.cuh"
#include "kernels/cuda/moe_grouped.cuh"
#include "kernels/cuda/sampling.cuh"
#include "kernels/cuda/testing/device_buffer.cuh"
#include "kernels/cuda/testing/moe_test_entry.h"
#include "core/dtype.h"
#include "core/status.h"

namespace dsv41rt::kernels::cuda::testing {

void moe_route(const float* x, const float* gate_w, const float* bias, int64_t S, int64_t H,
               int64_t E, int64_t k, float routed_scaling_factor, bool normalize, int32_t* idx,
               float* weight) {
  DSV41RT_CHECK(S >= 0 && H > 0 && E > 0, "moe_route: S=", S, " H=", H, " E=", E);
  DSV41RT_CHECK(k >= 1 && k <= E, "moe_route: k=", k, " must be in [1, E=", E, "]");
  DSV41RT_CHECK(S == 0 || (x && gate_w && idx && weight), "moe_route: null pointer");
  if (S == 0) return;
  DeviceBuffer<float> dx(x, S * H), dg(gate_w, E * H), db(bias, bias ? E : 0);
  DeviceBuffer<int32_t> di(S * k);
  DeviceBuffer<float> dw(S * k);
  di.poison();
  dw.poison();
  finish(cuda::moe_route(dx.get(), dg.get(), bias ? db.get() : nullptr, S, H, E, k,
                         routed_scaling_factor, normalize, di.get(), dw.get(), nullptr));
  di.to_host(idx);
  dw.to_host(weight);
}

void moe_forward(const float* x, const int32_t* idx, const float* weight, int64_t S, int64_t H,
                 int64_t k, int64_t E, int64_t I, const float* w1, const float* w3, const float* w2,
                 const float* shared_w1, const float* shared_w3, const float* shared_w2,
                 int64_t I_shared, float limit, float* y) {
  DSV41RT_CHECK(S >= 0 && H > 0 && k >= 1 && E > 0 && I > 0, "moe_forward: S=", S, " H=", H,
                " k=", k, " E=", E, " I=", I);
  if (S == 0) return;
  const bool shared = shared_w1 != nullptr;
  DSV41RT_CHECK(!shared || (shared_w3 && shared_w2 && I_shared > 0),
                "moe_forward: shared expert weights / I_shared=", I_shared);
  for (int64_t i = 0; i < S * k; ++i) {
    DSV41RT_CHECK(idx[i] >= 0 && idx[i] < E, "moe_forward: idx[", i / k, ", ", i % k,
                  "] = ", idx[i], " outside [0, ", E, ")");
  }
  DeviceBuffer<float> dx(x, S * H), dwt(weight, S * k);
  DeviceBuffer<int32_t> di(idx, S * k);
  DeviceBuffer<float> d1(w1, E * I * H), d3(w3, E * I * H), d2(w2, E * H * I);
  const int64_t ns = shared ? I_shared * H : 0;
  DeviceBuffer<float> s1(shared_w1, ns), s3(shared_w3, ns), s2(shared_w2, ns);
  DeviceBuffer<float> dy(S * H);
  dy.poison();
  finish(cuda::moe_forward(dx.get(), di.get(), dwt.get(), S, H, k, E, I, d1.get(), d3.get(),
                           d2.get(), shared ? s1.get() : nullptr, shared ? s3.get() : nullptr,
                           shared ? s2.get() : nullptr, shared ? I_shared : 0, limit, dy.get(),
                           nullptr));
  dy.to_host(y);
}

namespace {

std::vector<uint16_t> to_bf16(const float* v, int64_t n) {
  std::vector<uint16_t> out(size_t(n > 0 ? n : 0));
  for (int64_t i = 0; i < n; ++i) out[size_t(i)] = f32_to_bf16(v[i]);
  return out;
}

}  // namespace

void moe_forward_split(const float* x, const int32_t* idx, const float* weight, int64_t S,
                       int64_t H, int64_t k, int64_t E, int64_t I, const float* w1, const float* w3,
                       const float* w2, const float* shared_w1, const float* shared_w3,
                       const float* shared_w2, int64_t I_shared, float limit, int64_t chunk,
                       bool bf16_weights, float* y) {
  DSV41RT_CHECK(S >= 0 && H > 0 && k >= 1 && E > 0 && I > 0 && chunk >= 1,
                "moe_forward_split: S=", S, " H=", H, " k=", k, " E=", E, " I=", I,
                " chunk=", chunk);
  if (S == 0) return;
  const bool shared = shared_w1 != nullptr;
  DSV41RT_CHECK(!shared || (shared_w3 && shared_w2 && I_shared > 0),
                "moe_forward_split: shared expert weights / I_shared=", I_shared);
  for (int64_t i = 0; i < S * k; ++i) {
    DSV41RT_CHECK(idx[i] >= 0 && idx[i] < E, "moe_forward_split: idx[", i / k, ", ", i % k,
                  "] = ", idx[i], " outside [0, ", E, ")");
  }
  DeviceBuffer<float> dx(x, S * H), dwt(weight, S * k);
  DeviceBuffer<int32_t> di(idx, S * k);
  const int64_t ns = shared ? I_shared * H : 0;
  const int64_t ws = cuda::moe_split_workspace_floats(chunk, k, I, shared ? I_shared : 0);
  DeviceBuffer<float> work(ws), dy(S * H);
  work.poison();
  dy.poison();
  if (!bf16_weights) {
    DeviceBuffer<float> d1(w1, E * I * H), d3(w3, E * I * H), d2(w2, E * H * I);
    DeviceBuffer<float> s1(shared_w1, ns), s3(shared_w3, ns), s2(shared_w2, ns);
    finish(cuda::moe_forward_split(
        dx.get(), di.get(), dwt.get(), S, H, k, E, I, d1.get(), d3.get(), d2.get(),
        shared ? s1.get() : nullptr, shared ? s3.get() : nullptr, shared ? s2.get() : nullptr,
        shared ? I_shared : 0, limit, dy.get(), work.get(), ws, nullptr));
  } else {
    const auto b1 = to_bf16(w1, E * I * H), b3 = to_bf16(w3, E * I * H),
               b2 = to_bf16(w2, E * H * I);
    const auto c1 = to_bf16(shared_w1, ns), c3 = to_bf16(shared_w3, ns),
               c2 = to_bf16(shared_w2, ns);
    DeviceBuffer<uint16_t> d1(b1.data(), E * I * H), d3(b3.data(), E * I * H),
        d2(b2.data(), E * H * I);
    DeviceBuffer<uint16_t> s1(c1.data(), ns), s3(c3.data(), ns), s2(c2.data(), ns);
    finish(cuda::moe_forward_split_bf16w(
        dx.get(), di.get(), dwt.get(), S, H, k, E, I, d1.get(), d3.get(), d2.get(),
        shared ? s1.get() : nullptr, shared ? s3.get() : nullptr, shared ? s2.get() : nullptr,
        shared ? I_shared : 0, limit, dy.get(), work.get(), ws, nullptr));
  }
  dy.to_host(y);
}

void gemm_bf16_tc(const float* x, int64_t ldx, const float* w, int64_t ldw, float* y, int64_t ldy,
                  int64_t M, int64_t N, int64_t K, bool accumulate, int64_t batch, int64_t stride_x,
                  int64_t stride_w, int64_t stride_y, int64_t x_elems, int64_t w_elems,
                  int64_t y_elems) {
  DSV41RT_CHECK(M >= 0 && N >= 0 && K > 0 && batch >= 1, "gemm_bf16_tc: M=", M, " N=", N, " K=", K,
                " batch=", batch);
  const auto wb = to_bf16(w, w_elems);
  DeviceBuffer<float> dx(x, x_elems), dy(y, y_elems);
  DeviceBuffer<uint16_t> dw(wb.data(), w_elems);
  if (!accumulate) dy.poison();
  TcGemm g;
  g.a = dx.get(), g.lda = ldx, g.b = dw.get(), g.ldb = ldw, g.c = dy.get(), g.ldc = ldy;
  g.m = M, g.n = N, g.k = K, g.accumulate = accumulate;
  g.batch = batch, g.stride_a = stride_x, g.stride_b = stride_w, g.stride_c = stride_y;
  finish(cuda::gemm_bf16_tc(g, nullptr));
  dy.to_host(y);
}

double gemm_bf16_tc_time_ms(int64_t M, int64_t N, int64_t K, int reps) {
  DSV41RT_CHECK(M > 0 && N > 0 && K > 0 && reps > 0, "gemm_bf16_tc_time_ms: M=", M, " N=", N,
                " K=", K, " reps=", reps);
  std::vector<float> x(size_t(M * K));
  std::vector<uint16_t> w(size_t(N * K));
  uint32_t state = 12345u;
  auto next = [&] {  // uniform in [-1, 1): random, never zeros (zeros can run faster)
    state = state * 1664525u + 1013904223u;
    return float(state >> 8) / float(1u << 23) - 1.0f;
  };
  for (float& v : x) v = next();
  for (uint16_t& v : w) v = f32_to_bf16(next() * 0.05f);
  DeviceBuffer<float> dx(x.data(), M * K), dy(M * N);
  DeviceBuffer<uint16_t> dw(w.data(), N * K);
  TcGemm g;
  g.a = dx.get(), g.lda = K, g.b = dw.get(), g.ldb = K, g.c = dy.get(), g.ldc = N;
  g.m = M, g.n = N, g.k = K;
  cudaEvent_t e0, e1;
  DSV41RT_CUDA_CHECK(cudaEventCreate(&e0));
  DSV41RT_CUDA_CHECK(cudaEventCreate(&e1));
  std::vector<float> ms;
  for (int r = 0; r < reps + 2; ++r) {
    DSV41RT_CUDA_CHECK(cudaEventRecord(e0, nullptr));
    DSV41RT_CUDA_CHECK(cuda::gemm_bf16_tc(g, nullptr));
    DSV41RT_CUDA_CHECK(cudaEventRecord(e1, nullptr));
    DSV41RT_CUDA_CHECK(cudaEventSynchronize(e1));
    float t = 0.0f;
    DSV41RT_CUDA_CHECK(cudaEventElapsedTime(&t, e0, e1));
    if (r >= 2) ms.push_back(t);  // two warm-up launches
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

void moe_grouped_bf16(const float* x, const int32_t* idx, const float* weight, int64_t S, int64_t H,
                      int64_t k, int64_t E, int64_t I, const float* w1, const float* w3,
                      const float* w2, const float* shared_w1, const float* shared_w3,
                      const float* shared_w2, int64_t I_shared, float limit, float* y) {
  DSV41RT_CHECK(S >= 0 && H > 0 && k >= 1 && E > 0 && I > 0, "moe_grouped_bf16: S=", S, " H=", H,
                " k=", k, " E=", E, " I=", I);
  if (S == 0) return;
  const bool shared = shared_w1 != nullptr;
  const int64_t Is = shared ? I_shared : 0, ns = Is * H;
  const auto b1 = to_bf16(w1, E * I * H), b3 = to_bf16(w3, E * I * H), b2 = to_bf16(w2, E * H * I);
  const auto c1 = to_bf16(shared_w1, ns), c3 = to_bf16(shared_w3, ns), c2 = to_bf16(shared_w2, ns);
  DeviceBuffer<float> dx(x, S * H), dwt(weight, S * k), dy(S * H);
  DeviceBuffer<int32_t> di(idx, S * k);
  DeviceBuffer<uint16_t> d1(b1.data(), E * I * H), d3(b3.data(), E * I * H),
      d2(b2.data(), E * H * I);
  DeviceBuffer<uint16_t> s1(c1.data(), ns), s3(c3.data(), ns), s2(c2.data(), ns);
  const MoeGroupedSizes sz = moe_grouped_sizes(S, H, k, E, I, Is);
  DeviceBuffer<int32_t> ints(sz.ints);
  DeviceBuffer<float> floats(sz.floats);
  ints.poison();
  floats.poison();
  dy.poison();
  const MoeGroupedWorkspace ws = moe_grouped_carve(ints.get(), floats.get(), S, H, k, E, I, Is);
  finish(cuda::moe_grouped_bf16(dx.get(), di.get(), dwt.get(), S, H, k, E, I, d1.get(), d3.get(),
                                d2.get(), shared ? s1.get() : nullptr, shared ? s3.get() : nullptr,
                                shared ? s2.get() : nullptr, Is, limit, dy.get(), ws, nullptr));
  dy.to_host(y);
}

void engram_hash_rows(const int64_t* compressed_ids, int64_t S, int64_t max_ngram, int64_t n_heads,
                      const int64_t* multipliers, const int64_t* primes, const int64_t* offsets,
                      int64_t pad_id, int64_t* rows) {
  DSV41RT_CHECK(S >= 0 && max_ngram >= 2 && n_heads >= 1, "engram_hash_rows: S=", S,
                " max_ngram=", max_ngram, " n_heads=", n_heads);
  DSV41RT_CHECK(pad_id >= 0, "engram_hash_rows: pad_id=", pad_id);
  const int64_t cols = (max_ngram - 1) * n_heads;
  for (int64_t c = 0; c < cols; ++c) {
    DSV41RT_CHECK(primes[c] > 0, "engram_hash_rows: primes[", c, "] = ", primes[c]);
  }
  if (S == 0) return;
  DeviceBuffer<int64_t> dids(compressed_ids, S + max_ngram - 1), dm(multipliers, max_ngram);
  DeviceBuffer<int64_t> dp(primes, cols), doff(offsets, cols), dr(S * cols);
  dr.poison();
  finish(cuda::engram_hash_rows(dids.get(), S, max_ngram, n_heads, dm.get(), dp.get(), doff.get(),
                                pad_id, dr.get(), nullptr));
  dr.to_host(rows);
}

void engram_forward(float* X, const float* emb, const float* wkv, const float* q_weight,
                    const float* k_weight, const uint8_t* token_mask, int64_t S, int64_t n,
                    int64_t H, int64_t D, float eps) {
  DSV41RT_CHECK(S >= 0 && n >= 1 && H > 0 && D > 0, "engram_forward: S=", S, " n=", n, " H=", H,
                " D=", D);
  if (S == 0) return;
  DeviceBuffer<float> dX(X, S * n * H), de(emb, S * D), dwkv(wkv, (n + 1) * H * D);
  DeviceBuffer<float> dq(q_weight, n * H), dk(k_weight, n * H);
  DeviceBuffer<uint8_t> dmask(token_mask, token_mask ? S : 0);
  DeviceBuffer<float> kv(cuda::engram_forward_workspace(S, n, H));
  kv.poison();
  finish(cuda::engram_forward(dX.get(), de.get(), dwkv.get(), dq.get(), dk.get(),
                              token_mask ? dmask.get() : nullptr, S, n, H, D, eps, kv.get(),
                              nullptr));
  dX.to_host(X);
}

namespace {

// The CPU reference's argument checks (kernels/cpu/sampling.cc check_inputs), on the host.
void check_sampling_inputs(const float* logits, int64_t V, const kernels::SamplingParams& p,
                           const int32_t* prompt, int64_t n_prompt, const int32_t* output,
                           int64_t n_output) {
  kernels::validate_sampling_params(p, V);
  bool any_finite = false;
  for (int64_t i = 0; i < V; ++i) {
    const float l = logits[i];
    DSV41RT_CHECK(!std::isnan(l) && l != INFINITY, "sampling: logits[", i, "] is ", l,
                  " (only finite values and -inf are allowed)");
    any_finite |= std::isfinite(l);
  }
  DSV41RT_CHECK(any_finite, "sampling: no token has a finite logit");
  DSV41RT_CHECK(n_prompt >= 0 && n_output >= 0, "sampling: negative token count");
  DSV41RT_CHECK(n_prompt == 0 || prompt != nullptr, "sampling: prompt is null");
  DSV41RT_CHECK(n_output == 0 || output != nullptr, "sampling: output is null");
  for (int64_t i = 0; i < n_prompt; ++i) {
    DSV41RT_CHECK(prompt[i] >= 0 && prompt[i] < V, "sampling: prompt[", i, "] = ", prompt[i],
                  " is not a token id in [0, ", V, ")");
  }
  for (int64_t i = 0; i < n_output; ++i) {
    DSV41RT_CHECK(output[i] >= 0 && output[i] < V, "sampling: output[", i, "] = ", output[i],
                  " is not a token id in [0, ", V, ")");
  }
}

// Device copies of one row's inputs (a batch of one).
struct SamplingRow {
  SamplingRow(const float* logits, int64_t V, const kernels::SamplingParams& p, const int32_t* prompt,
              int64_t n_prompt, const int32_t* output, int64_t n_output)
      : dl(logits, V),
        dp(&p, 1),
        dprompt(prompt, n_prompt),
        doutput(output, n_output),
        dpoff(std::vector<int64_t>{0, n_prompt}.data(), 2),
        dooff(std::vector<int64_t>{0, n_output}.data(), 2),
        ws(cuda::sampling_workspace_bytes(V)) {
    ws.poison();
  }
  DeviceBuffer<float> dl;
  DeviceBuffer<kernels::SamplingParams> dp;
  DeviceBuffer<int32_t> dprompt, doutput;
  DeviceBuffer<int64_t> dpoff, dooff;
  DeviceBuffer<unsigned char> ws;
};

}  // namespace

void sampling_probs(const float* logits, int64_t V, const kernels::SamplingParams& p,
                    const int32_t* prompt, int64_t n_prompt, const int32_t* output,
                    int64_t n_output, float* probs) {
  check_sampling_inputs(logits, V, p, prompt, n_prompt, output, n_output);
  SamplingRow row(logits, V, p, prompt, n_prompt, output, n_output);
  DeviceBuffer<float> dprobs(V);
  dprobs.poison();
  finish(cuda::sampling_probs(row.dl.get(), 1, V, row.dp.get(), row.dprompt.get(), row.dpoff.get(),
                              row.doutput.get(), row.dooff.get(), row.ws.get(), dprobs.get(),
                              nullptr));
  dprobs.to_host(probs);
}

kernels::SampledToken sample_token(const float* logits, int64_t V, const kernels::SamplingParams& p,
                               const int32_t* prompt, int64_t n_prompt, const int32_t* output,
                               int64_t n_output, uint64_t step) {
  check_sampling_inputs(logits, V, p, prompt, n_prompt, output, n_output);
  SamplingRow row(logits, V, p, prompt, n_prompt, output, n_output);
  const int32_t n_top = static_cast<int32_t>(std::min<int64_t>(p.top_logprobs, V));
  DeviceBuffer<uint64_t> dstep(&step, 1);
  DeviceBuffer<int32_t> dtok(1), dids(n_top);
  DeviceBuffer<float> dlp(1), dlps(n_top);
  dtok.poison();
  dlp.poison();
  dids.poison();
  dlps.poison();
  finish(cuda::sample_token(row.dl.get(), nullptr, 1, V, row.dp.get(), row.dprompt.get(), row.dpoff.get(),
                            row.doutput.get(), row.dooff.get(), dstep.get(), row.ws.get(),
                            dtok.get(), dlp.get(), n_top, dids.get(), dlps.get(), nullptr));
  kernels::SampledToken out;
  dtok.to_host(&out.token);
  dlp.to_host(&out.logprob);
  out.top_ids.resize(n_top);
  out.top_logprobs.resize(n_top);
  dids.to_host(out.top_ids.data());
  dlps.to_host(out.top_logprobs.data());
  DSV41RT_CHECK(out.token >= 0 && out.token < V, "sample_token: device returned token ", out.token);
  return out;
}

}  // namespace dsv41rt::kernels::cuda::testing
