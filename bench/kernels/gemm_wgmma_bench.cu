// Throughput of the prefill GEMM (kernels/cuda/gemm_wgmma.cuh) at bench-40 prefill shapes,
// M = 1024, 4096 and 8192 rows, with its staging kernels, with B decoded from the stored FP8 inside
// the kernel (WgmmaGemm::bw), and of the Engram kv projection's FP32-exact split (gemm_f32_split3).
//
// Method: per shape, a CUDA graph of `launches` calls timed with events over whole replays
// (median of the replays). GEMM rows: 2 M n k FLOPs over the time, as a share of the 790 TFLOP/s
// BF16 roofline of bench/bench_executor.py (BF16_FLOPS); staging rows: the bytes they
// read and write (stored FP8 32 x 32 weights -> BF16; FP32 activations -> BF16). The operands are
// fixed hash values (BF16 of |v| ~ 2^-7; FP8 codes without NaN), so no input is degenerate.
// Usage: gemm_wgmma_bench [--quick]   (stdout only: a markdown table)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "bench_util.cuh"
#include "kernels/cuda/gemm_wgmma.cuh"

namespace {

namespace kc = dsv41rt::kernels::cuda;
using dsv41rt::kernels::WeightFormat;
using dsv41rt::kernels::WeightView;

constexpr double kBf16Roofline = 790e12;

struct Shape {
  const char* name;
  int64_t n, k;
};

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::printf("device: %s (%d SMs)\n\n", prop.name, prop.multiProcessorCount);
  std::vector<Shape> shapes = {
      {"wq_a", 1280, 5120}, {"wq_b", 32768, 1280},     {"wo_a (one group)", 1024, 4096},
      {"wo_b", 5120, 8192}, {"shared w1", 2304, 5120}, {"shared w2", 5120, 2304}};
  std::vector<int64_t> ms = {1024, 4096, 8192};
  if (quick) shapes.resize(2), ms = {4096};
  const int launches = quick ? 5 : 10, reps = quick ? 3 : 7;

  std::printf("| kernel | shape (n x k) | M | us / call | TFLOP/s or GB/s | %% of roofline |\n");
  std::printf("|---|---|---|---|---|---|\n");
  for (const Shape& sh : shapes) {
    // Stored FP8 32 x 32 weights, their BF16 staging, activations FP32 and BF16, C FP32.
    uint8_t *w8 = nullptr, *sc = nullptr;
    uint16_t *wb = nullptr, *ab = nullptr;
    float *x = nullptr, *c = nullptr;
    const int64_t mmax = ms.back();
    CHECK(cudaMalloc(&w8, size_t(sh.n * sh.k)));
    CHECK(cudaMalloc(&sc, size_t((sh.n / 32) * (sh.k / 32))));
    CHECK(cudaMalloc(&wb, size_t(sh.n * sh.k) * 2));
    CHECK(cudaMalloc(&ab, size_t(mmax * sh.k) * 2));
    CHECK(cudaMalloc(&x, size_t(mmax * sh.k) * 4));
    CHECK(cudaMalloc(&c, size_t(mmax * sh.n) * 4));
    fill_codes<<<1024, 256, 0, s>>>(w8, sh.n * sh.k, 7u, 1);
    CHECK(cudaMemsetAsync(sc, 120, size_t((sh.n / 32) * (sh.k / 32)), s));
    fill_f32<<<1024, 256, 0, s>>>(x, mmax * sh.k);
    WeightView w;
    w.data = w8, w.scale = sc, w.format = WeightFormat::kFp8Block, w.rows = sh.n, w.cols = sh.k;
    w.block_rows = w.block_cols = 32;
    const double wt_us = time_graph(
        s, launches, reps, [&](int) { CHECK(kc::weight_to_bf16(w, 0, sh.n, wb, sh.k, s)); });
    const double wt_bytes = double(sh.n * sh.k) * 3 + double(w.scale_bytes());
    std::printf("| weight_to_bf16 (FP8 32x32) | %s %lld x %lld | - | %.1f | %.0f GB/s | |\n",
                sh.name, (long long)sh.n, (long long)sh.k, wt_us, wt_bytes / (wt_us * 1e-6) / 1e9);
    for (const int64_t m : ms) {
      const double cv_us = time_graph(
          s, launches, reps, [&](int) { CHECK(kc::rows_to_bf16(x, sh.k, m, sh.k, ab, sh.k, s)); });
      kc::WgmmaGemm g;
      g.a = ab, g.lda = sh.k, g.b = wb, g.ldb = sh.k, g.c = c, g.ldc = sh.n;
      g.m = m, g.n = sh.n, g.k = sh.k;
      const double us =
          time_graph(s, launches, reps, [&](int) { CHECK(kc::gemm_bf16_wgmma(g, s)); });
      const double tflops = 2.0 * double(m) * double(sh.n) * double(sh.k) / (us * 1e-6) / 1e12;
      std::printf("| rows_to_bf16 | %s | %lld | %.1f | %.0f GB/s | |\n", sh.name, (long long)m,
                  cv_us, double(m * sh.k) * 6 / (cv_us * 1e-6) / 1e9);
      std::printf("| gemm_bf16_wgmma | %s %lld x %lld | %lld | %.1f | %.0f TFLOP/s | %.0f%% |\n",
                  sh.name, (long long)sh.n, (long long)sh.k, (long long)m, us, tflops,
                  100.0 * tflops * 1e12 / kBf16Roofline);
      // The same GEMM with B decoded from the stored FP8 inside the kernel (WgmmaGemm::bw), against
      // the staged pair weight_to_bf16 + gemm above.
      kc::WgmmaGemm gs = g;
      gs.b = nullptr, gs.ldb = 0, gs.bw = w;
      const double st_us =
          time_graph(s, launches, reps, [&](int) { CHECK(kc::gemm_bf16_wgmma(gs, s)); });
      const double st_tflops =
          2.0 * double(m) * double(sh.n) * double(sh.k) / (st_us * 1e-6) / 1e12;
      std::printf(
          "| gemm, B stored FP8 (staged: %.1f us) | %s %lld x %lld | %lld | %.1f | %.0f TFLOP/s | "
          "%.0f%% |\n",
          wt_us + us, sh.name, (long long)sh.n, (long long)sh.k, (long long)m, st_us, st_tflops,
          100.0 * st_tflops * 1e12 / kBf16Roofline);
    }
    CHECK(cudaFree(w8));
    CHECK(cudaFree(sc));
    CHECK(cudaFree(wb));
    CHECK(cudaFree(ab));
    CHECK(cudaFree(x));
    CHECK(cudaFree(c));
  }

  // The Engram kv projection at bench-40's widths: kv [M, 25600] = emb [M, 7680] wkv^T, FP32,
  // with 256 MB workspaces as the runtime uses; FLOPs counted as the FP32 GEMM's (2 M n k), the
  // split's 9 BF16 products each being part of one.
  {
    const int64_t m = 4096, n = 25600, k = 7680, ws = int64_t(128) << 20;
    float *a = nullptr, *b = nullptr, *c = nullptr;
    uint16_t *aw = nullptr, *bw = nullptr;
    CHECK(cudaMalloc(&a, size_t(m * k) * 4));
    CHECK(cudaMalloc(&b, size_t(n * k) * 4));
    CHECK(cudaMalloc(&c, size_t(m * n) * 4));
    CHECK(cudaMalloc(&aw, size_t(ws) * 2));
    CHECK(cudaMalloc(&bw, size_t(ws) * 2));
    fill_f32<<<1024, 256, 0, s>>>(a, m * k);
    fill_f32<<<1024, 256, 0, s>>>(b, n * k);
    const double us = time_graph(s, 1, quick ? 2 : 3, [&](int) {
      CHECK(kc::gemm_f32_split3(a, k, b, k, m, n, k, c, n, aw, ws, bw, ws, s));
    });
    std::printf(
        "| gemm_f32_split3 (Engram kv) | %lld x %lld | %lld | %.1f | %.1f TFLOP/s (FP32) | |\n",
        (long long)n, (long long)k, (long long)m, us,
        2.0 * double(m) * double(n) * double(k) / (us * 1e-6) / 1e12);
    CHECK(cudaFree(a));
    CHECK(cudaFree(b));
    CHECK(cudaFree(c));
    CHECK(cudaFree(aw));
    CHECK(cudaFree(bw));
  }
  return 0;
}
