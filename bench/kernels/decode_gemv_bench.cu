// Bandwidth of the decode GEMM (kernels/cuda/decode_gemv.cuh) at bench-40 shapes, m = 1, 8, 64.
//
// Method: the device-to-device copy bandwidth first (cudaMemcpyAsync of 2 GiB, read + write bytes
// over time, median of 5) as the ceiling; then per shape enough copies of the weights that they
// exceed 200 MB together (the 50 MB L2 cannot hold them), a CUDA graph of >= 20 launches cycling
// through the copies, timed with events over whole replays (median of >= 5). Bytes moved per call
// = weight codes + scales + x (FP32) + y (FP32); split-K partials stay out of the count.
// Usage: decode_gemv_bench [--quick] [--only NAME]   (stdout only: a markdown table; --only keeps
// the shape of that name, e.g. for a profiler run)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bench_util.cuh"
#include "kernels/cuda/decode_gemv.cuh"
#include "kernels/cuda/decode_gemv_a8.cuh"

namespace {

namespace kc = dsv41rt::kernels::cuda;
using dsv41rt::kernels::WeightFormat;
using dsv41rt::kernels::WeightView;

struct Shape {
  const char* name;
  WeightFormat fmt;
  int64_t n, k;
};

const char* fmt_name(WeightFormat f) {
  return f == WeightFormat::kBF16 ? "bf16" : (f == WeightFormat::kFp8Block ? "fp8 32x32" : "mxfp4");
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    quick = quick || std::strcmp(argv[i], "--quick") == 0;
    if (std::strcmp(argv[i], "--only") == 0 && i + 1 < argc) only = argv[++i];
  }
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const double copy_gbs = copy_bandwidth(quick, s);
  std::printf("device: %s (%d SMs, L2 %d MB)\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize >> 20);
  std::printf("copy bandwidth (read + write): %.0f GB/s\n\n", copy_gbs);

  std::vector<Shape> shapes = {
      {"wq_a", WeightFormat::kFp8Block, 1280, 5120},
      {"wkv", WeightFormat::kFp8Block, 512, 5120},
      {"wq_a+wkv", WeightFormat::kFp8Block, 1792, 5120},
      {"wq_b", WeightFormat::kFp8Block, 32768, 1280},
      {"wo_b", WeightFormat::kFp8Block, 5120, 8192},
      {"shared w1", WeightFormat::kFp8Block, 2304, 5120},
      {"shared w2", WeightFormat::kFp8Block, 5120, 2304},
      {"idx_wq_b", WeightFormat::kFp8Block, 4096, 1280},
      {"expert w1", WeightFormat::kMxfp4, 2304, 5120},
      {"expert w2", WeightFormat::kMxfp4, 5120, 2304},
      {"head", WeightFormat::kBF16, 129280, 5120},
  };
  if (quick) shapes = {shapes[0], shapes[3], shapes[4], shapes[8], shapes[10]};
  if (!only.empty()) {
    shapes.erase(std::remove_if(shapes.begin(), shapes.end(),
                                [&](const Shape& sh) { return only != sh.name; }),
                 shapes.end());
    if (shapes.empty()) {
      std::printf("no shape named %s\n", only.c_str());
      return 2;
    }
  }
  const std::vector<int64_t> ms = {1, 8, 64};
  const int reps = quick ? 5 : 9;
  const int64_t min_total = int64_t(200) << 20;

  std::printf(
      "| shape | n x k | format | m | splits | us / call | MB moved | GB/s | %% of copy | y hash "
      "|\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Shape& sh : shapes) {
    WeightView w;
    w.format = sh.fmt, w.rows = sh.n, w.cols = sh.k;
    if (sh.fmt == WeightFormat::kFp8Block) w.block_rows = w.block_cols = 32;
    const int64_t data_b = w.data_bytes(), scale_b = w.scale_bytes();
    const int64_t copies = std::max<int64_t>(1, (min_total + data_b - 1) / data_b);
    std::vector<uint8_t*> data(copies), scale(copies, nullptr);
    for (int64_t c = 0; c < copies; ++c) {
      CHECK(cudaMalloc(&data[c], size_t(data_b)));
      fill_codes<<<1024, 256, 0, s>>>(
          data[c], data_b, uint32_t(c * 7919 + 1),
          sh.fmt == WeightFormat::kBF16 ? 0 : (sh.fmt == WeightFormat::kFp8Block ? 1 : 2));
      if (scale_b > 0) {
        CHECK(cudaMalloc(&scale[c], size_t(scale_b)));
        CHECK(cudaMemsetAsync(scale[c], 120, size_t(scale_b), s));
      }
    }
    float *x = nullptr, *y = nullptr, *ws = nullptr;
    CHECK(cudaMalloc(&x, size_t(64 * sh.k) * 4));
    CHECK(cudaMalloc(&y, size_t(64 * sh.n) * 4));
    fill_f32<<<256, 256, 0, s>>>(x, 64 * sh.k);
    for (const int64_t m : ms) {
      std::vector<kc::DecodeGemv> calls(copies);
      for (int64_t c = 0; c < copies; ++c) {
        kc::DecodeGemv& g = calls[c];
        g.x = x, g.ldx = sh.k, g.y = y, g.ldy = sh.n, g.m = m, g.n = sh.n, g.k = sh.k;
        g.w = w, g.w.data = data[c], g.w.scale = scale[c];
      }
      const int64_t wsf = kc::decode_gemv_workspace_floats(calls[0]);
      if (wsf > 0) CHECK(cudaMalloc(&ws, size_t(wsf) * 4));
      if (!kc::decode_gemv_supported(calls[0])) {
        std::printf("| %s | unsupported |\n", sh.name);
        continue;
      }
      const int launches = int(std::max<int64_t>(20, copies));
      const double t = time_graph(s, launches, reps, [&](int i) {
        CHECK(kc::decode_gemv_bf16(calls[i % copies], ws, wsf, s));
      });
      const double bytes = double(data_b + scale_b) + double(m) * double(sh.k + sh.n) * 4.0;
      const double gbs = bytes / (t * 1e-6) / 1e9;
      std::printf("| %s | %lld x %lld | %s A16 | %lld | %lld | %.2f | %.1f | %.0f | %.0f%% | |\n",
                  sh.name, (long long)sh.n, (long long)sh.k, fmt_name(sh.fmt), (long long)m,
                  (long long)kc::decode_gemv_splits(calls[0]), t, bytes / 1e6, gbs,
                  100.0 * gbs / copy_gbs);
      std::fflush(stdout);
      if (sh.fmt == WeightFormat::kFp8Block) {  // the A8 kernel on the same weights
        const int64_t ldq = (kc::act_fp8_row_bytes(sh.k) + 15) / 16 * 16;
        uint8_t* xq = nullptr;
        CHECK(cudaMalloc(&xq, size_t(64 * ldq)));
        CHECK(kc::quantize_act_fp8(x, m, sh.k, sh.k, xq, ldq, s));
        for (const kc::A8Path path : {kc::A8Path::kWgmma, kc::A8Path::kMmaSync}) {
          std::vector<kc::DecodeGemvA8> a8(copies);
          for (int64_t c = 0; c < copies; ++c) {
            kc::DecodeGemvA8& g = a8[c];
            g.xq = xq, g.ldq = ldq, g.w = calls[c].w, g.y = y, g.ldy = sh.n;
            g.m = m, g.n = sh.n, g.k = sh.k, g.path = path;
          }
          if (!kc::decode_gemv_a8_supported(a8[0])) continue;
          const int64_t wsf8 = kc::decode_gemv_a8_workspace_floats(a8[0]);
          float* ws8 = nullptr;
          if (wsf8 > 0) CHECK(cudaMalloc(&ws8, size_t(wsf8) * 4));
          const double t8 = time_graph(s, launches, reps, [&](int i) {
            CHECK(kc::decode_gemv_a8(a8[i % copies], ws8, wsf8, s));
          });
          const double tq = time_graph(s, launches, reps, [&](int) {
            CHECK(kc::quantize_act_fp8(x, m, sh.k, sh.k, xq, ldq, s));
          });
          const double b8 = double(data_b + scale_b) + double(m) * double(ldq + sh.n * 4);
          const double g8 = b8 / (t8 * 1e-6) / 1e9;
          // The last call's output (copy (launches - 1) % copies), hashed: two builds of a kernel
          // that should give the same bits can be compared from their tables.
          CHECK(kc::decode_gemv_a8(a8[(launches - 1) % copies], ws8, wsf8, s));
          std::vector<uint32_t> out(size_t(m * sh.n));
          CHECK(cudaMemcpyAsync(out.data(), y, out.size() * 4, cudaMemcpyDeviceToHost, s));
          CHECK(cudaStreamSynchronize(s));
          uint64_t hash = 1469598103934665603ull;  // FNV-1a over the output words
          for (const uint32_t v : out) hash = (hash ^ v) * 1099511628211ull;
          std::printf(
              "| %s | %lld x %lld | %s A8 %s (+ %.2f us quantise) | %lld | %lld | %.2f | %.1f | "
              "%.0f | %.0f%% | %016llx |\n",
              sh.name, (long long)sh.n, (long long)sh.k, fmt_name(sh.fmt),
              path == kc::A8Path::kWgmma ? "wgmma" : "mma.sync", tq, (long long)m,
              (long long)kc::decode_gemv_a8_splits(a8[0]), t8, b8 / 1e6, g8, 100.0 * g8 / copy_gbs,
              (unsigned long long)hash);
          std::fflush(stdout);
          if (ws8) CHECK(cudaFree(ws8));
        }
        CHECK(cudaFree(xq));
      }
      if (ws) CHECK(cudaFree(ws));
      ws = nullptr;
    }
    for (int64_t c = 0; c < copies; ++c) {
      CHECK(cudaFree(data[c]));
      if (scale[c]) CHECK(cudaFree(scale[c]));
    }
    CHECK(cudaFree(x));
    CHECK(cudaFree(y));
  }
  CHECK(cudaStreamDestroy(s));
  return 0;
}
