// Benchmark of kernels::cuda::moe_decode_bf16 (MXFP4 routed experts + FP8 shared expert, read as
// stored) at DeepSeek-V4.1 bench-40 shapes: E = 32, k = 6, H = 5120, I = Is = 2304, S = 1 / 8 / 64.
//
// Method: (1) the copy ceiling: device-to-device cudaMemcpyAsync of 2 GiB, (read + write bytes) /
// time, median of 5. (2) per S: 10 calls captured in one CUDA graph, each with its own routing
// (random, fixed seed; touched experts fall as they may) and cycling through 2 copies of every
// weight (> 1.2 GB in all, L2 is 50 MB), replays timed with events, median of >= 5 replays.
// Bytes per call = codes + scales of the experts that call touches (+ the shared expert); the
// activations and the workspace are < 1 % and not counted. --quick: 256 MiB copy, fewer replays.
// Prints a markdown table on stdout.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "bench_util.cuh"
#include "kernels/cuda/moe_decode.cuh"

namespace kc = dsv41rt::kernels::cuda;
using dsv41rt::kernels::WeightFormat;
using dsv41rt::kernels::WeightView;

namespace {

constexpr int64_t kE = 32, kK = 6, kH = 5120, kI = 2304, kIs = 2304;
constexpr int kCalls = 10, kCopies = 2;

__global__ void fill_floats(float* p, int64_t n, uint32_t seed) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    p[i] = float(hash(uint64_t(i), seed) % 20001) * 1e-4f - 1.0f;
  }
}

uint8_t* device_bytes(int64_t n, uint32_t seed, int kind, int lo = 0) {
  uint8_t* p = nullptr;
  CHECK(cudaMalloc(&p, size_t(n)));
  fill_bytes<<<1024, 256>>>(p, n, seed, kind, lo);
  CHECK(cudaGetLastError());
  return p;
}

WeightView mxfp4(int64_t rows, int64_t cols, uint32_t seed) {
  WeightView v;
  v.format = WeightFormat::kMxfp4, v.rows = rows, v.cols = cols;
  v.data = device_bytes(v.data_bytes(), seed, 0);
  v.scale = device_bytes(v.scale_bytes(), seed + 1, 2, 118);
  return v;
}

WeightView fp8(int64_t rows, int64_t cols, uint32_t seed) {
  WeightView v;
  v.format = WeightFormat::kFp8Block, v.rows = rows, v.cols = cols;
  v.block_rows = v.block_cols = 32;
  v.data = device_bytes(v.data_bytes(), seed, 1);
  v.scale = device_bytes(v.scale_bytes(), seed + 1, 2, 112);
  return v;
}

int64_t bytes_of(const WeightView& v) { return v.data_bytes() + v.scale_bytes(); }

float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double copy_bandwidth(int64_t bytes) {
  void *a = nullptr, *b = nullptr;
  CHECK(cudaMalloc(&a, size_t(bytes)));
  CHECK(cudaMalloc(&b, size_t(bytes)));
  CHECK(cudaMemset(a, 1, size_t(bytes)));
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  CHECK(cudaMemcpyAsync(b, a, size_t(bytes), cudaMemcpyDeviceToDevice));  // warm-up
  std::vector<float> ms;
  for (int r = 0; r < 5; ++r) {
    CHECK(cudaEventRecord(e0));
    CHECK(cudaMemcpyAsync(b, a, size_t(bytes), cudaMemcpyDeviceToDevice));
    CHECK(cudaEventRecord(e1));
    CHECK(cudaEventSynchronize(e1));
    float t = 0;
    CHECK(cudaEventElapsedTime(&t, e0, e1));
    ms.push_back(t);
  }
  CHECK(cudaFree(a));
  CHECK(cudaFree(b));
  return 2.0 * double(bytes) / (double(median(ms)) * 1e-3);  // read + write
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  const double copy_bw = copy_bandwidth(quick ? (int64_t(256) << 20) : (int64_t(2) << 30));
  std::printf(
      "# moe_decode_bf16 on %s\n\ncopy bandwidth (D2D, read + write, median of 5): %.0f GB/s\n\n",
      prop.name, copy_bw * 1e-9);

  // kCopies copies of all routed experts and of the shared expert.
  struct Weights {
    WeightView w1, w3, w2, sw1, sw3, sw2;
  };
  std::vector<Weights> copies;
  for (int c = 0; c < kCopies; ++c) {
    const uint32_t s = 100u * uint32_t(c + 1);
    copies.push_back({mxfp4(kE * kI, kH, s), mxfp4(kE * kI, kH, s + 10), mxfp4(kE * kH, kI, s + 20),
                      fp8(kIs, kH, s + 30), fp8(kIs, kH, s + 40), fp8(kH, kIs, s + 50)});
  }
  const int64_t expert_bytes =
      (bytes_of(copies[0].w1) + bytes_of(copies[0].w3) + bytes_of(copies[0].w2)) / kE;
  const int64_t shared_bytes =
      bytes_of(copies[0].sw1) + bytes_of(copies[0].sw3) + bytes_of(copies[0].sw2);

  float *x = nullptr, *y = nullptr, *wt = nullptr;
  int32_t* idx = nullptr;
  const int64_t maxS = kc::kMoeDecodeMaxTokens;
  CHECK(cudaMalloc(&x, size_t(kCalls * maxS * kH * 4)));
  CHECK(cudaMalloc(&y, size_t(maxS * kH * 4)));
  CHECK(cudaMalloc(&wt, size_t(kCalls * maxS * kK * 4)));
  CHECK(cudaMalloc(&idx, size_t(kCalls * maxS * kK * 4)));
  fill_floats<<<1024, 256>>>(x, kCalls * maxS * kH, 7);
  const std::vector<float> host_wt(size_t(kCalls * maxS * kK), 1.0f / kK);
  CHECK(cudaMemcpy(wt, host_wt.data(), host_wt.size() * 4, cudaMemcpyHostToDevice));

  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  std::printf(
      "| S | touched experts (mean) | us / call | MB / call (touched + shared) | GB/s | %% of copy "
      "|\n");
  std::printf("|---|---|---|---|---|---|\n");
  std::mt19937 rng(1234);
  for (const int64_t S : {int64_t(1), int64_t(8), int64_t(64)}) {
    // Routing: k distinct experts per token, uniformly at random (fixed seed).
    std::vector<int32_t> host_idx(size_t(kCalls * S * kK));
    double touched_sum = 0, bytes_sum = 0;
    for (int c = 0; c < kCalls; ++c) {
      std::set<int32_t> touched;
      for (int64_t t = 0; t < S; ++t) {
        std::vector<int32_t> perm(kE);
        for (int32_t e = 0; e < kE; ++e) perm[size_t(e)] = e;
        std::shuffle(perm.begin(), perm.end(), rng);
        for (int64_t j = 0; j < kK; ++j) {
          host_idx[size_t((c * S + t) * kK + j)] = perm[size_t(j)];
          touched.insert(perm[size_t(j)]);
        }
      }
      touched_sum += double(touched.size());
      bytes_sum += double(int64_t(touched.size()) * expert_bytes + shared_bytes);
    }
    CHECK(cudaMemcpy(idx, host_idx.data(), host_idx.size() * 4, cudaMemcpyHostToDevice));

    std::vector<kc::MoeDecode> calls(kCalls);
    int64_t ws_bytes = 0;
    for (int c = 0; c < kCalls; ++c) {
      kc::MoeDecode& p = calls[size_t(c)];
      const Weights& w = copies[size_t(c % kCopies)];
      p.x = x + c * maxS * kH, p.idx = idx + c * S * kK, p.weight = wt + c * S * kK;
      p.S = S, p.H = kH, p.k = kK, p.E = kE, p.I = kI, p.Is = kIs, p.limit = 10.0f, p.y = y;
      p.w1 = w.w1, p.w3 = w.w3, p.w2 = w.w2, p.sw1 = w.sw1, p.sw3 = w.sw3, p.sw2 = w.sw2;
      if (!kc::moe_decode_supported(p)) {
        std::printf("unsupported problem\n");
        return 1;
      }
      ws_bytes = std::max(ws_bytes, kc::moe_decode_workspace_bytes(p));
    }
    void* ws = nullptr;
    CHECK(cudaMalloc(&ws, size_t(ws_bytes)));
    CHECK(cudaDeviceSynchronize());

    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (const kc::MoeDecode& p : calls) CHECK(kc::moe_decode_bf16(p, ws, ws_bytes, stream));
    CHECK(cudaStreamEndCapture(stream, &graph));
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    CHECK(cudaGraphLaunch(exec, stream));  // warm-up
    CHECK(cudaStreamSynchronize(stream));
    std::vector<float> ms;
    for (int r = 0; r < (quick ? 5 : 15); ++r) {
      CHECK(cudaEventRecord(e0, stream));
      CHECK(cudaGraphLaunch(exec, stream));
      CHECK(cudaEventRecord(e1, stream));
      CHECK(cudaEventSynchronize(e1));
      float t = 0;
      CHECK(cudaEventElapsedTime(&t, e0, e1));
      ms.push_back(t);
    }
    const double us = double(median(ms)) * 1e3 / kCalls;
    const double bytes = bytes_sum / kCalls, gbs = bytes / (us * 1e-6) * 1e-9;
    std::printf("| %lld | %.1f | %.1f | %.1f | %.0f | %.1f |\n", (long long)S, touched_sum / kCalls,
                us, bytes * 1e-6, gbs, 100.0 * gbs / (copy_bw * 1e-9));
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(graph));
    CHECK(cudaFree(ws));
  }
  return 0;
}
